"""One output sink: results go to stdout (human tables or one JSON document), chatter to stderr.

Consoles are wide and never wrap when stdout is not a terminal, so that file:line and key paths stay on
one line for grep and for tests.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

PIPE_WIDTH = 160


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(
        file=stream, stderr=stderr, width=None if tty else PIPE_WIDTH, soft_wrap=not tty, highlight=False
    )


def stdout_console() -> Console:
    """A console on the current stdout (re-created each call: tests swap sys.stdout)."""
    return _console(False)


def stderr_console() -> Console:
    """A console on the current stderr."""
    return _console(True)


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
