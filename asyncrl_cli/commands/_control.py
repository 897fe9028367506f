"""Shared by `attach`, `ctl` and `status`: control-plane errors → one CLI message and exit code, and a Ray
connection that lasts only as long as the command.

Exit codes: 1 invalid knob value or a change the controller refused, 2 usage (including a RUN that matches
several live runs), 4 no cluster / run not found / controller unreachable.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from asyncrl_cli.errors import EXIT_INVALID, EXIT_USAGE, AsyncrlError

EXIT_NO_RUN = 4


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def control_exit_code(err: BaseException) -> int:
    """The CLI's exit code for a control-plane error (`engine.control.errors`; the engine raises typed errors
    and knows nothing of exit codes): 4 no cluster / run not found / controller unreachable, 2 a RUN that
    matches several live runs, 1 a refused change, a name in use, or any other control error."""
    from engine.control import errors
    from engine.control.registry import NameInUse

    codes: list[tuple[type[BaseException], int]] = [
        (errors.NoClusterError, EXIT_NO_RUN),
        (errors.RunNotFoundError, EXIT_NO_RUN),
        (errors.SourceUnavailable, EXIT_NO_RUN),
        (errors.AmbiguousRunError, EXIT_USAGE),
        (errors.KnobRejected, EXIT_INVALID),
        (NameInUse, EXIT_INVALID),
    ]
    return next((code for cls, code in codes if isinstance(err, cls)), EXIT_INVALID)


@contextmanager
def control_errors() -> Iterator[None]:
    """Turn `ControlError` / `KnobError` raised inside into an `AsyncrlError` with the right exit code."""
    from engine.control.errors import ControlError
    from engine.control.knobs import KnobError

    try:
        yield
    except ControlError as err:
        raise AsyncrlError(str(err), exit_code=control_exit_code(err)) from None
    except KnobError as err:
        raise AsyncrlError(str(err), exit_code=EXIT_INVALID) from None


@contextmanager
def command_connection() -> Iterator[None]:
    """Disconnect from Ray at the end if the command itself connected: each command joins the cluster of the
    run it names, and must not leave that connection for the next command of the same process (tests)."""
    connected_before = _ray_connected()
    try:
        yield
    finally:
        if not connected_before and _ray_connected():
            import ray

            ray.shutdown()
