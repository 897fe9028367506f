"""Pure formatting helpers shared by the dashboard widgets and `asyncrl status` (no Textual imports)."""

from __future__ import annotations

import math
import time
from typing import Any

MISSING = "—"


def is_number(value: Any) -> bool:
    """A finite int/float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fmt_num(value: Any, digits: int = 3) -> str:
    """Compact number: integers as-is, floats to `digits` significant digits, `—` when missing."""
    if not is_number(value):
        return MISSING if value is None or isinstance(value, float) else str(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e6):
        return f"{int(value):d}"
    return f"{value:.{digits}g}"


def fmt_rate(value: Any) -> str:
    """Tokens per second: `950`, `1.35k`, `12.4M`."""
    if not is_number(value):
        return MISSING
    v = float(value)
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.0f}"


def fmt_pct(value: Any) -> str:
    """A fraction in [0, 1] as a percentage with one decimal."""
    return f"{100 * float(value):.1f}%" if is_number(value) else MISSING


def fmt_duration(seconds: Any) -> str:
    """`42s`, `3m05s`, `2h07m`; `—` when missing or negative."""
    if not is_number(seconds) or seconds < 0:
        return MISSING
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_clock(unix_s: Any) -> str:
    """Local wall-clock time `HH:MM:SS` of a unix timestamp."""
    if not is_number(unix_s):
        return MISSING
    return time.strftime("%H:%M:%S", time.localtime(float(unix_s)))


def fmt_value(value: Any) -> str:
    """Any config/knob value for display (bools lower-case like TOML, lists compact)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_value(v) for v in value) + "]"
    return str(value)


def flatten(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted `(key, value)` pairs of a nested dict, in insertion order (lists stay values)."""
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(flatten(value, dotted + "."))
        else:
            out.append((dotted, value))
    return out
