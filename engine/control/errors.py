"""Control-plane errors, typed so that callers tell them apart (the CLI maps each type to its exit code)."""

from __future__ import annotations


class ControlError(Exception):
    """A control-plane failure with a one-line message."""


class NoClusterError(ControlError):
    """No Ray cluster could be reached at the given address."""


class RunNotFoundError(ControlError):
    """The cluster (or directory) has no such run."""


class AmbiguousRunError(ControlError):
    """Several runs are live and none was named."""


class SourceUnavailable(ControlError):
    """The source stopped answering (controller died, cluster gone); the dashboard shows a banner."""


class KnobRejected(ControlError):
    """The controller refused a knob change or action (out of range, version conflict, run over)."""
