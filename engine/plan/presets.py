"""Where the preset catalog (`{runs,models,datasets,hardware}/*.toml` and the JSON schemas) lives.

In order: `$ASYNCRL_PRESETS_DIR` (or its short alias `$ASYNCRL_PRESETS`) when set; else `presets/` at the root
of the source tree this package runs from (a checkout, or an editable install); else the copy an installed
wheel ships as package data (`engine/plan/_presets/`, see pyproject's `package-data`).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VARS = ("ASYNCRL_PRESETS_DIR", "ASYNCRL_PRESETS")
"""Environment variables naming the preset directory explicitly (the first one set wins)."""

SOURCE_PRESETS = Path(__file__).resolve().parents[2] / "presets"
"""`presets/` of the source tree (exists in a checkout and behind an editable install)."""

PACKAGED_PRESETS = Path(__file__).resolve().parent / "_presets"
"""The presets a built wheel carries as package data."""


def presets_dir() -> Path:
    """Where the presets live: the env path, else the source tree's, else the installed package's."""
    for var in ENV_VARS:
        env = os.environ.get(var)
        if env:
            return Path(env).expanduser()
    if SOURCE_PRESETS.is_dir() or not PACKAGED_PRESETS.is_dir():
        return SOURCE_PRESETS
    return PACKAGED_PRESETS
