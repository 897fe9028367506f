"""Shared by `attach`, `ctl` and `status`: control-plane errors → one CLI message and exit code, and a Ray
connection that lasts only as long as the command.

Exit codes: 1 invalid knob value or a change the controller refused, 2 usage (including a RUN that matches
several live runs), 4 no cluster / run not found / controller unreachable.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from asyncrl_cli.errors import AsyncrlError

EXIT_NO_RUN = 4


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


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
