"""Problems found while loading or checking a run config, collected and reported all at once.

A `Problem` names where it was found (file and line, when known) and the dotted key path it concerns.
Its `category` decides the exit code of `asyncrl validate`: any `invalid` error → 1, otherwise any `fit`
error → 3 (does not fit the hardware), otherwise 0. Warnings and notes never fail a run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
Category = Literal["invalid", "fit"]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_DOES_NOT_FIT = 3
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Problem:
    """One finding. `file`/`line` locate the key's value in the layer that set it (None when defaulted)."""

    severity: Severity
    code: str
    message: str
    key: str | None = None
    file: str | None = None
    line: int | None = None
    hint: str | None = None
    category: Category = "invalid"

    @property
    def where(self) -> str:
        """`file:line`, `file`, or `-` when the value came from a default."""
        if self.file is None:
            return "-"
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--json` output."""
        out = asdict(self)
        out["where"] = self.where
        return out

    def render(self) -> str:
        """One line: `error  file:line  key  message (hint)`."""
        parts = [self.severity, self.where]
        if self.key:
            parts.append(self.key)
        text = "  ".join(parts) + "  " + self.message
        if self.hint:
            text += f" — {self.hint}"
        return text


def errors(problems: Iterable[Problem]) -> list[Problem]:
    """The problems of severity `error`."""
    return [p for p in problems if p.severity == "error"]


def exit_code_for(problems: Iterable[Problem]) -> int:
    """0 when no errors; 1 when any error is `invalid`; 3 when the only errors are `fit` errors."""
    errs = errors(problems)
    if not errs:
        return EXIT_OK
    if any(p.category == "invalid" for p in errs):
        return EXIT_INVALID
    return EXIT_DOES_NOT_FIT


_ORDER = {"error": 0, "warning": 1, "info": 2}


def sorted_problems(problems: Iterable[Problem]) -> list[Problem]:
    """Errors first, then warnings, then notes; stable within a severity."""
    return sorted(problems, key=lambda p: _ORDER[p.severity])


def warn(code: str, key: str, msg: str, hint: str | None = None) -> Problem:
    """A warning about `key` (the config rules' shorthand)."""
    return Problem("warning", code, msg, key, hint=hint)


def error(code: str, key: str, msg: str, hint: str | None = None, category: str = "invalid") -> Problem:
    """An error about `key`: category `invalid` (exit 1) or `fit` (exit 3)."""
    return Problem("error", code, msg, key, hint=hint, category=category)  # type: ignore[arg-type]


def note(code: str, key: str, msg: str, hint: str | None = None) -> Problem:
    """An informational note about `key`."""
    return Problem("info", code, msg, key, hint=hint)
