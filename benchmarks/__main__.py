"""`python -m benchmarks …` — see `benchmarks.cli`."""

import sys

from benchmarks.cli import main

sys.exit(main())
