"""The controller's `checkpoint` and `stop` actions: an on-demand checkpoint mid-run, a graceful stop with
its own checkpoint (exit 0), and a resume that finishes the run with every step once and an exact ledger."""

from __future__ import annotations

import threading
import time

import pytest
import ray
from reliability_helpers import assert_ledger_exact, events, tiny_config, train_steps

from engine.persist.checkpoint import latest_valid, list_checkpoints, read_checkpoint
from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

STEPS = 24
EXTRA = (f"rollout.total_rollout_steps={STEPS * 8}", "data.max_response_length=8")


def _operator(run_dir, name: str, done: list) -> None:
    """Like `asyncrl ctl RUN checkpoint` then `... stop`, once the run has trained a few steps."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(train_steps(run_dir)) < 2:
        time.sleep(0.05)
    # the driver's namespace, asyncrl.<run id>: this thread shares its process
    controller = ray.get_actor(name, namespace=ray.get_runtime_context().namespace)
    ray.get(controller.request_action.remote("checkpoint", "tester@test"))
    while time.monotonic() < deadline and not events(run_dir, "checkpoint"):
        time.sleep(0.05)
    saved_at = events(run_dir, "checkpoint")[0]["step"]
    while time.monotonic() < deadline and len(train_steps(run_dir)) <= saved_at:
        time.sleep(0.05)  # stop one step later, so the stop checkpoint is a second one
    ray.get(controller.request_action.remote("stop", "tester@test"))
    done.append(True)


def test_on_demand_checkpoint_and_graceful_stop_then_resume(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, *EXTRA)
    done: list = []
    t = threading.Thread(target=_operator, args=(run_dir, cfg.name, done), daemon=True)
    t.start()
    assert run(resolve_plan(cfg), progress=False) == 0
    t.join(timeout=10)
    assert done
    assert "run stopped" in capsys.readouterr().err
    reasons = [read_checkpoint(p)["state"]["reason"] for p in list_checkpoints(run_dir / "checkpoints")]
    assert reasons == ["on_demand", "stop"], reasons
    stopped_at = read_checkpoint(latest_valid(run_dir / "checkpoints"))["state"]["step"]
    assert stopped_at < STEPS

    assert run(resolve_plan(cfg), resume="auto", progress=False) == 0
    assert events(run_dir, "resume")[0]["step"] == stopped_at
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    assert_ledger_exact(cfg, run_dir, trained=STEPS * 8)
