"""The preset catalog: `presets/{runs,models,datasets,hardware}/*.toml`.

The directory is `engine.plan.presets.presets_dir()`: `$ASYNCRL_PRESETS_DIR` (or `$ASYNCRL_PRESETS`) when set,
else `presets/` at the root of the source tree (a checkout, an editable install), else the copy an installed
wheel carries as package data.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.plan.presets import presets_dir

KINDS: tuple[str, ...] = ("runs", "models", "datasets", "hardware")
RUN_SCHEMA_FILE = "asyncrl.schema.json"
HARDWARE_SCHEMA_FILE = "hardware.schema.json"

__all__ = ["KINDS", "RUN_SCHEMA_FILE", "HARDWARE_SCHEMA_FILE", "PresetRef", "find_preset", "list_presets",
           "preset_names", "presets_dir"]


@dataclass(frozen=True)
class PresetRef:
    """One preset file: its kind (runs, models, ...), name (file stem) and path."""

    kind: str
    name: str
    path: Path

    @property
    def ref(self) -> str:
        """The name to write in `extends`: `kind/name`."""
        return f"{self.kind}/{self.name}"

    def description(self) -> str:
        """The `description` key, else the first comment line that is not a directive."""
        text = self.path.read_text(encoding="utf-8")
        try:
            desc = tomllib.loads(text).get("description")
        except tomllib.TOMLDecodeError:
            desc = None
        if isinstance(desc, str) and desc:
            return desc
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("#") and not s.startswith("#:") and len(s) > 1:
                return s.lstrip("# ").strip()
        return ""


def list_presets(kind: str | None = None) -> list[PresetRef]:
    """All presets (of one kind), sorted by kind then name."""
    root = presets_dir()
    out: list[PresetRef] = []
    for k in KINDS if kind is None else (kind,):
        for p in sorted((root / k).glob("*.toml")):
            out.append(PresetRef(k, p.stem, p))
    return out


def find_preset(name: str) -> list[PresetRef]:
    """Presets matching `kind/name` or a bare `name` (all kinds); several matches = ambiguous."""
    name = name.removesuffix(".toml")
    if "/" in name:
        kind, _, stem = name.partition("/")
        p = presets_dir() / kind / f"{stem}.toml"
        return [PresetRef(kind, stem, p)] if kind in KINDS and p.is_file() else []
    return [r for r in list_presets() if r.name == name]


def preset_names() -> list[str]:
    """Every `kind/name`, for suggestions."""
    return [r.ref for r in list_presets()]
