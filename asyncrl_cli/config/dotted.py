"""Dotted key paths (`trainer.optim.lr`) over nested dicts and over flat path-keyed maps.

Pure Python, no schema: the layering, the provenance table, `init`'s choices and the report share these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def get_path(data: Mapping[str, Any], key: str) -> Any:
    """The value at dotted `key` inside nested dicts, or None where a part is missing (or not a dict)."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` inside nested dicts, creating (or replacing non-dict) intermediate tables."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value


def nearest(flat: Mapping[str, T], key: str) -> T | None:
    """In a map keyed by dotted paths: the entry of `key`, else of its nearest ancestor, else None."""
    parts = key.split(".")
    while parts:
        found = flat.get(".".join(parts))
        if found is not None:
            return found
        parts.pop()
    return None
