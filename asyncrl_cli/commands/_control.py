"""Shared by `attach`, `ctl` and `status`: control-plane errors → one CLI message and exit code.

Exit codes: 1 invalid knob value or a change the controller refused, 2 usage, 4 no cluster / run not found
/ controller unreachable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from asyncrl_cli.errors import AsyncrlError

EXIT_NO_RUN = 4


@contextmanager
def control_errors() -> Iterator[None]:
    """Turn `ControlError` / `KnobError` raised inside into an `AsyncrlError` with the right exit code."""
    from engine.runtime.control_errors import ControlError
    from engine.runtime.knobs import KnobError

    try:
        yield
    except ControlError as err:
        raise AsyncrlError(str(err), exit_code=err.exit_code) from None
    except KnobError as err:
        raise AsyncrlError(str(err), exit_code=1) from None
