"""Acceptance (issue 5): on a real tiny run, change trigger_parameter_sync_step 4 → 2 through the client the
dashboard uses; events.jsonl shows syncs every 4 local steps before the change and every 2 after it, and
the change records who, when and the step at which it took effect."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "presets" / "runs" / "tiny-cpu.toml"
SMALL = (
    "trainer.ppo_mini_batch_size=8",
    "trainer.ppo_micro_batch_size_per_gpu=16",
    "rollout.n=4",
    "rollout.total_rollout_steps=160",
    "trainer.test_freq=0",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.staleness_threshold=0.5",
)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete records only: a last line without its newline is still being written by the live run."""
    text = path.read_text()
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_sync_interval_change_takes_effect_and_is_audited(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from asyncrl_cli.config import load_run_config
    from engine.control.client import ControlClient
    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    if ray.is_initialized():
        pytest.skip("needs a process without a Ray connection: the driver starts its own cluster")
    run_dir = tmp_path / "run"
    loaded = load_run_config(TINY, [f'logging.run_dir="{run_dir}"', "logging.progress=false", *SMALL])
    assert loaded.config is not None, [str(p) for p in loaded.problems]
    cfg = loaded.config
    codes: list[int] = []
    driver = threading.Thread(target=lambda: codes.append(run(resolve_plan(cfg), progress=False)), daemon=True)
    driver.start()
    try:
        wait_for(lambda: ray.is_initialized() and not codes, 120, "the driver's Ray cluster")
        wait_for(lambda: cfg.name in ray.util.list_named_actors() or codes, 120, "the run's controller")
        client = ControlClient(cfg.name, who="operator@acceptance")

        def synced_at_4() -> bool:
            return any(e["kind"] == "sync" and e["step"] == 4 for e in client.snapshot(0)["events"]) or bool(
                codes
            )

        wait_for(synced_at_4, 300, "the first sync at step 4")
        version = client.get_knobs()["trigger_parameter_sync_step"]["version"]
        result = client.set_knob("trigger_parameter_sync_step", 2, expected_version=version)
        assert result["ok"], result
    finally:
        driver.join(timeout=600)
    assert codes == [0]

    events = read_jsonl(run_dir / "events.jsonl")
    applied = [
        e for e in events if e.get("knob") == "trigger_parameter_sync_step" and e.get("phase") == "applied"
    ]
    assert len(applied) == 1
    change = applied[0]
    assert (change["old"], change["new"], change["who"]) == (4, 2, "operator@acceptance")
    assert change["requested_at"] <= change["time"] and change["requested_step"] <= change["applied_step"]
    switch = change["applied_step"]
    syncs = [e["step"] for e in events if e["kind"] == "sync"]
    # before the switch every 4 steps; from it every 2 — the step it applies at may sync at once (the steps since
    # the last sync already reach the new interval), so it belongs to the new schedule
    before = [s for s in syncs if s < switch]
    after = [s for s in syncs if s >= switch]
    assert before and all(s % 4 == 0 for s in before), syncs
    assert len(after) >= 2 and after[0] - switch <= 2, syncs
    assert all(b - a == 2 for a, b in zip(after, after[1:], strict=False)), syncs
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "asyncrl/sync_interval" in r]
    assert {r["asyncrl/sync_interval"] for r in records if r["training/global_step"] > switch} == {2}
