"""Control-plane errors; each carries the CLI exit code (1 invalid value, 2 usage, 4 no cluster / no run)."""

from __future__ import annotations


class ControlError(Exception):
    """A control-plane failure with a one-line message and the CLI exit code to use."""

    exit_code = 1


class NoClusterError(ControlError):
    """No Ray cluster could be reached at the given address."""

    exit_code = 4


class RunNotFoundError(ControlError):
    """The cluster (or directory) has no such run."""

    exit_code = 4


class AmbiguousRunError(ControlError):
    """Several runs are live and none was named."""

    exit_code = 2


class SourceUnavailable(ControlError):
    """The source stopped answering (controller died, cluster gone); the dashboard shows a banner."""

    exit_code = 4


class KnobRejected(ControlError):
    """The controller refused a knob change or action (out of range, version conflict, run over)."""

    exit_code = 1
