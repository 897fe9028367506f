"""The resolved config as a table of dotted keys, with where each value came from (provenance)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from asyncrl_cli.tui.format import flatten, fmt_value


def provenance_of(provenance: dict[str, Any], key: str) -> str:
    """Where `key` came from: its own entry, else its nearest ancestor's, else `default`.

    Accepts the loader's `Provenance.to_json()` (`{"keys": {dotted: {"where": "file:line", ...}}}`) or a
    plain `{dotted: "file:line"}` mapping.
    """
    table = provenance.get("keys") if isinstance(provenance.get("keys"), dict) else provenance
    probe = key
    while probe:
        found = table.get(probe)
        if isinstance(found, dict):
            found = found.get("where") or found.get("source")
        if found:
            return str(found)
        probe = probe.rpartition(".")[0]
    return "default"


class ConfigView(DataTable):
    """Read-only table `key | value | source`, rebuilt only when the config changes."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._shown: tuple[int, int] | None = None

    def on_mount(self) -> None:
        self.add_column("key", key="key", width=44)
        self.add_column("value", key="value", width=40)
        self.add_column("source", key="source")

    def show(self, config: dict[str, Any], provenance: dict[str, Any]) -> None:
        fingerprint = (hash(repr(config)), hash(repr(provenance)))
        if fingerprint == self._shown:
            return
        self._shown = fingerprint
        self.clear()
        for key, value in flatten(config):
            source = provenance_of(provenance, key)
            style = "dim" if source == "default" else "cyan"
            self.add_row(Text(key), Text(fmt_value(value)), Text(source, style=style), key=key)
