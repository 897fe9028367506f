"""Exit codes belong to the CLI: the control plane raises typed errors, `asyncrl_cli.commands._control` maps
each type to the documented code (4 no cluster / no run / unreachable, 2 ambiguous RUN, 1 refused)."""

from __future__ import annotations

import pytest

from asyncrl_cli.commands._control import control_errors, control_exit_code
from asyncrl_cli.errors import AsyncrlError
from engine.control import errors
from engine.control.knobs import KnobError
from engine.control.registry import NameInUse


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.NoClusterError, 4),
        (errors.RunNotFoundError, 4),
        (errors.SourceUnavailable, 4),
        (errors.AmbiguousRunError, 2),
        (errors.KnobRejected, 1),
        (NameInUse, 1),
        (errors.ControlError, 1),
    ],
)
def test_each_control_error_gets_its_exit_code_and_one_line(error: type[Exception], code: int) -> None:
    with pytest.raises(AsyncrlError) as err, control_errors():
        raise error("no run named 'x' on this machine")
    assert err.value.exit_code == code == control_exit_code(error("m"))
    assert str(err.value) == "no run named 'x' on this machine"


def test_a_bad_knob_value_exits_1() -> None:
    with pytest.raises(AsyncrlError) as err, control_errors():
        raise KnobError("trigger_parameter_sync_step must be ≥ 1")
    assert err.value.exit_code == 1


def test_the_engine_errors_carry_no_exit_code() -> None:
    """The engine knows nothing of the CLI's exit codes (the mapping above is the only one)."""
    for cls in (errors.ControlError, errors.NoClusterError, errors.RunNotFoundError, errors.AmbiguousRunError,
                errors.SourceUnavailable, errors.KnobRejected, NameInUse):
        assert not hasattr(cls, "exit_code")
