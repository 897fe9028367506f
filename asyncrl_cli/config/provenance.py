"""Where each config value came from: a default, a file (with line), or a `--set` flag."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl_cli.config.dotted import nearest

OriginKind = Literal["default", "file", "set", "preset"]


@dataclass(frozen=True)
class Origin:
    """The layer that set a key: `source` is a file path, `--set`, or `default`."""

    kind: OriginKind
    source: str
    line: int | None = None
    env_vars: tuple[str, ...] = ()
    """Environment variables the value referenced, outermost first (the first one overrides it)."""
    note: str | None = None

    @property
    def where(self) -> str:
        """`file:line` (or the source alone)."""
        return f"{self.source}:{self.line}" if self.line is not None else self.source

    def to_json(self) -> dict[str, Any]:
        """A plain dict for JSON output."""
        return {
            "kind": self.kind,
            "source": self.source,
            "line": self.line,
            "where": self.where,
            "env_vars": list(self.env_vars),
            "note": self.note,
        }


DEFAULT = Origin("default", "default")


@dataclass
class Provenance:
    """Per-key origins of the merged config (dotted paths), and the files in merge order."""

    origins: dict[str, Origin] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    root: str | None = None
    """The file that was loaded (the top of the `extends` chain)."""

    def get(self, key: str) -> Origin:
        """The origin of `key`, or of its nearest set ancestor (values inside inline tables and arrays),
        or — for a table — of the first key set inside it, or `DEFAULT` when nothing set it."""
        o = nearest(self.origins, key)
        if o is not None:
            return o
        below = [o for k, o in self.origins.items() if key and k.startswith(key + ".")]
        if below:  # a table: the first key written inside it
            return min(below, key=lambda o: (o.source, o.line or 0))
        return DEFAULT

    def is_set(self, key: str) -> bool:
        """True when some layer wrote `key` (or a table containing it) explicitly."""
        return self.get(key).kind != "default"

    def drop_subtree(self, key: str) -> None:
        """Forget the origins of `key` and everything under it (the value was replaced)."""
        prefix = key + "."
        for k in [k for k in self.origins if k == key or k.startswith(prefix)]:
            del self.origins[k]

    def to_json(self) -> dict[str, Any]:
        """`{"files": [...], "keys": {path: origin}}`."""
        return {
            "root": self.root,
            "files": self.files,
            "keys": {k: o.to_json() for k, o in sorted(self.origins.items())},
        }
