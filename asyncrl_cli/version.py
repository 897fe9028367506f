"""`asyncrl --version`: the installed distribution's version (`importlib.metadata`), or — from a source tree
that is not installed — `[project] version` of the pyproject.toml next to the package. Standard library only,
so the flag answers without building the command tree."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DIST = "asyncrl"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
VERSION_FLAGS = ("--version", "-V")


def package_version(pyproject: Path = PYPROJECT) -> str:
    """`0.1.0`: the installed metadata first; else the source tree's pyproject; else `unknown`."""
    try:
        return version(DIST)
    except PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def version_line() -> str:
    return f"{DIST} {package_version()}"
