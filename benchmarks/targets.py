"""The issue's targets and how far a measurement is from each (pure functions; goals, not assertions)."""

from __future__ import annotations

from typing import Any, Literal

Op = Literal[">=", "<=", "true"]


def evaluate(
    name: str,
    measured: float | bool | None,
    goal: float | bool,
    op: Op,
    unit: str = "",
    why_missing: str = "",
) -> dict[str, Any]:
    """One target row: `status` is met / missed / not measured, and `missed_by_pct` how far off, relative
    to the goal:

        op ">=":  missed_by = (goal − measured) / goal      (measured below a floor)
        op "<=":  missed_by = (measured − goal) / goal      (measured above a ceiling)

    `op = "true"` is a yes/no target (no percentage)."""
    row: dict[str, Any] = {
        "target": name,
        "goal": goal,
        "op": op,
        "unit": unit,
        "measured": measured,
        "missed_by_pct": None,
    }
    if measured is None:
        row["status"] = "not measured"
        row["why"] = why_missing
        return row
    if op == "true":
        row["status"] = "met" if bool(measured) else "missed"
        return row
    value, floor = float(measured), float(goal)
    met = value >= floor if op == ">=" else value <= floor
    row["status"] = "met" if met else "missed"
    if not met and floor != 0:
        gap = (floor - value) if op == ">=" else (value - floor)
        row["missed_by_pct"] = round(100.0 * gap / abs(floor), 1)
    return row


def describe(row: dict[str, Any]) -> str:
    """`met`, `missed by 24.0 %`, `missed`, or `not measured (why)` — for the docs table."""
    if row["status"] == "not measured":
        return f"not measured ({row.get('why') or 'skipped'})"
    if row["status"] == "met":
        return "met"
    return f"missed by {row['missed_by_pct']} %" if row.get("missed_by_pct") is not None else "missed"
