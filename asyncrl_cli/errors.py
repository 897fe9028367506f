"""User-facing errors and the exit-code table.

| code | meaning |
|------|---------|
| 0    | ok |
| 1    | failure / invalid config |
| 2    | usage error (bad flags, missing files, malformed `--set`) |
| 3    | the run does not fit the hardware |
| 4    | no cluster reachable, or no live run of that name (`attach`, `ctl`, `status`) |
| 130  | interrupted (Ctrl-C) |

Commands raise `AsyncrlError` (or a subclass) for anything the user can fix; `handle_errors` turns it into
one clear message on stderr and the exit code, never a traceback. `ASYNCRL_DEBUG=1` re-raises instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from asyncrl_cli.config.problems import (
    EXIT_DOES_NOT_FIT,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
)

__all__ = [
    "EXIT_DOES_NOT_FIT", "EXIT_INTERRUPTED", "EXIT_INVALID", "EXIT_OK", "EXIT_USAGE",
    "AsyncrlError", "DoesNotFit", "InvalidConfig", "UsageProblem", "debug_enabled", "handle_errors",
]  # fmt: skip

F = TypeVar("F", bound=Callable[..., Any])


class AsyncrlError(Exception):
    """An error the user can act on: a message, an optional hint, and the exit code."""

    exit_code = EXIT_INVALID

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class InvalidConfig(AsyncrlError):
    """The config (or another input file) is invalid: exit 1."""


class UsageProblem(AsyncrlError):
    """Wrong flags or arguments: exit 2."""

    exit_code = EXIT_USAGE


class DoesNotFit(AsyncrlError):
    """The run cannot fit the hardware: exit 3."""

    exit_code = EXIT_DOES_NOT_FIT


def debug_enabled() -> bool:
    """True when `ASYNCRL_DEBUG` asks for tracebacks."""
    return os.environ.get("ASYNCRL_DEBUG", "") not in ("", "0", "false")


def report_error(err: AsyncrlError) -> None:
    """Print `error: message` (and `hint: …`) on stderr."""
    from asyncrl_cli.output import stderr_console

    con = stderr_console()
    con.print(f"[bold red]error:[/] {err.message}", highlight=False, markup=True, soft_wrap=True)
    if err.hint:
        con.print(f"[dim]hint:[/] {err.hint}", highlight=False, soft_wrap=True)


def handle_errors(fn: F) -> F:
    """Decorator for command functions: AsyncrlError → message + exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AsyncrlError as e:
            if debug_enabled():
                raise
            report_error(e)
            raise typer.Exit(e.exit_code) from None

    return wrapper  # type: ignore[return-value]
