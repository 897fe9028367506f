"""How a run's stop is handled and recorded by the driver: a graceful stop on a signal (the trainer checkpoints
within the grace period, waited for at most `STOP_TIMEOUT_S`), the `stop` event with what it saved and the
command that resumes it, and the event records the driver writes (`engine.telemetry.events.run_event`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from engine.persist.stop_grace import stop_deadline
from engine.telemetry.events import run_event
from engine.runtime.terminal import say

if TYPE_CHECKING:
    from engine.runtime.launch_context import StopContext

STOP_TIMEOUT_S = 120.0


def report_stop(result: dict[str, Any], stop: StopContext, controller: Any) -> None:
    if result.get("weights_sha256"):
        say(f"asyncrl: final weights sha256 {result['weights_sha256']}")
    if result.get("stopped"):
        line = f"run stopped at step {result.get('local_step')} ({result['stopped']})"
        record_stop(controller, line, result, stop)


def stop_with_checkpoint(trainer: Any, t_ref: Any, stop: StopContext, controller: Any) -> None:
    """A stop signal: ask the trainer for a graceful stop (it checkpoints: the full checkpoint, or within the
    grace period the light one when the full one does not fit) and wait for it a bounded time; then the `stop`
    event and the resume command."""
    import ray

    signals, grace = stop.signals, stop.grace_s
    name, at = signals.first or ("SIGINT", time.time())
    deadline = stop_deadline(at, grace)
    within = f" within the {grace:g} s grace period" if grace else ""
    say(f"\nasyncrl: {name}: stopping with a checkpoint{within} (a second signal abandons it)...")
    result: dict[str, Any] = {}
    try:
        trainer.request_stop.remote(f"interrupted by {name}", deadline, stop.weight_bytes)
        # the deadline only shapes what the trainer writes: waiting past it costs nothing (a scheduler's
        # SIGKILL ends the wait anyway) and keeps a state that arrives late when the grace was a guess
        result = ray.get(t_ref, timeout=STOP_TIMEOUT_S)
    except (KeyboardInterrupt, ray.exceptions.RayError) as e:  # best effort: the last checkpoint stays usable
        why = "abandoned by a second signal" if isinstance(e, KeyboardInterrupt) else type(e).__name__
        say(f"asyncrl: no stop checkpoint ({why})")
    record_stop(controller, f"stopped by {name}", result, stop, signal_name=name, grace_s=grace)


def record_stop(controller: Any, line: str, result: dict[str, Any], stop: StopContext, **extra: Any) -> None:
    """The `stop` event (what the stop saved, the resume command) and the same on stderr / in run.log."""
    import ray

    state = result.get("stop_state") or {}
    if state.get("kind") == "light":
        weights = (f"the weights of step {state['weights_step']}" if state.get("weights_step") is not None
                   else "the model's initial weights")
        saved = (f"the full checkpoint did not fit, so a light stop state was saved: {state['path']} (prompt stream "
                 f"position, queued and in-flight prompts of step {result.get('local_step')}; {weights})")
    elif state:
        saved = f"checkpoint {state['path']} saved"
    else:
        saved = "no stop checkpoint was saved"
    resume = stop.resume_hint()
    message = f"{line}: {saved}; {resume}"
    try:
        ray.get(controller.record_event.remote(run_event(
            "info", "stop", message, result.get("local_step"), result.get("version"), saved=state.get("kind"),
            path=state.get("path"), weights_step=state.get("weights_step"),
            resume=stop.resume_command(), **extra)), timeout=10)
    except Exception:  # noqa: BLE001 - the controller is gone; the line below still says it
        pass
    say(f"asyncrl: {message}")
