"""ControllerCore: cursors, ring buffers, knob validation, compare-and-set, acks, audit events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.loop.knobs import ROLLOUTER, TRAINER, KnobChange, KnobInbox
from engine.control.core import (
    KNOB_SPECS,
    ControllerCore,
    KnobError,
    parse_knob_value,
    validate_knob_value,
)

CONFIG = {
    "name": "t",
    "async_training": {"trigger_parameter_sync_step": 4, "staleness_threshold": 0.5},
    "logging": {"sinks": ["jsonl"]},
}


class Clock:
    """A settable clock so event times are exact."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(tmp_path: Path, clock: Clock) -> ControllerCore:
    return ControllerCore("t", run_dir=str(tmp_path), config=CONFIG, total_steps=40, clock=clock)


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_knobs_start_from_the_config(core: ControllerCore) -> None:
    knobs = core.get_knobs()
    assert knobs["trigger_parameter_sync_step"]["value"] == 4
    assert knobs["staleness_threshold"]["value"] == 0.5
    assert knobs["paused"]["value"] is False
    assert all(k["version"] == 0 and not k["pending"] for k in knobs.values())


def test_cursor_returns_each_item_exactly_once(core: ControllerCore) -> None:
    core.record_metrics({"training/global_step": 1})
    core.record_event({"kind": "sync", "message": "v1"})
    first = core.snapshot(0)
    assert [m["training/global_step"] for m in first["metrics"]] == [1]
    assert [e["kind"] for e in first["events"]] == ["sync"]
    core.record_metrics({"training/global_step": 2})
    second = core.snapshot(first["cursor"])
    assert [m["training/global_step"] for m in second["metrics"]] == [2]
    assert second["events"] == []
    assert second["cursor"] == first["cursor"] + 1
    assert core.snapshot(second["cursor"])["metrics"] == []


def test_ring_buffer_is_bounded_and_reports_truncation(tmp_path: Path, clock: Clock) -> None:
    core = ControllerCore("t", sinks=[], clock=clock, max_metrics=3)
    for step in range(1, 6):
        core.record_metrics({"training/global_step": step})
    snap = core.snapshot(0)
    assert [m["training/global_step"] for m in snap["metrics"]] == [3, 4, 5]
    assert snap["truncated"] is True
    assert core.snapshot(snap["cursor"] - 1)["truncated"] is False
    assert [m["training/global_step"] for m in core.snapshot(0, limit=2)["metrics"]] == [4, 5]


def test_metrics_get_a_time_and_update_step_and_version(core: ControllerCore, clock: Clock) -> None:
    clock.t += 12.5
    core.record_metrics({"training/global_step": 7, "fully_async/count/current_param_version": 2})
    record = core.snapshot()["metrics"][-1]
    assert record["asyncrl/time"] == pytest.approx(12.5)
    core.record_event({"kind": "sync", "message": "x"})
    event = core.snapshot()["events"][-1]
    assert (event["step"], event["version"], event["level"], event["time"]) == (7, 2, "info", clock.t)


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("trigger_parameter_sync_step", 0, "out of range"),
        ("trigger_parameter_sync_step", 1001, "out of range"),
        ("trigger_parameter_sync_step", 2.5, "must be an integer"),
        ("trigger_parameter_sync_step", "2", "must be an integer in [1, 1000]"),
        ("trigger_parameter_sync_step", True, "must be an integer"),
        ("staleness_threshold", -0.1, "out of range"),
        ("staleness_threshold", 10.5, "out of range"),
        ("staleness_threshold", float("nan"), "finite"),
        ("paused", 1, "true or false"),
        ("lr", 1e-5, "unknown knob"),
    ],
)
def test_invalid_values_are_rejected_with_a_reason(
    core: ControllerCore, tmp_path: Path, name: str, value: object, fragment: str
) -> None:
    result = core.set_knob(name, value, who="alice@h")
    assert result["ok"] is False
    assert fragment in result["reason"]
    assert all(k["version"] == 0 for k in core.get_knobs().values())
    rejected = [e for e in read_events(tmp_path) if e.get("phase") == "rejected"]
    assert rejected and rejected[-1]["level"] == "warning" and rejected[-1]["who"] == "alice@h"


def test_compare_and_set_between_two_operators(core: ControllerCore) -> None:
    seen = core.get_knobs()["trigger_parameter_sync_step"]["version"]
    alice = core.set_knob("trigger_parameter_sync_step", 2, expected_version=seen, who="alice@h1")
    bob = core.set_knob("trigger_parameter_sync_step", 8, expected_version=seen, who="bob@h2")
    assert alice == {"ok": True, "reason": alice["reason"], "version": 1}
    assert bob["ok"] is False
    assert (
        "version conflict" in bob["reason"] and "alice@h1" in bob["reason"] and "version 1" in bob["reason"]
    )
    knob = core.get_knobs()["trigger_parameter_sync_step"]
    assert (knob["value"], knob["version"], knob["pending"], knob["requested_by"]) == (2, 1, True, "alice@h1")
    retry = core.set_knob("trigger_parameter_sync_step", 8, expected_version=1, who="bob@h2")
    assert retry["ok"] and retry["version"] == 2


def test_setting_the_same_value_is_a_no_op(core: ControllerCore) -> None:
    result = core.set_knob("trigger_parameter_sync_step", 4, who="a@h")
    assert result["ok"] and "unchanged" in result["reason"] and result["version"] == 0


def test_ack_marks_applied_and_writes_the_audit_event(
    core: ControllerCore, clock: Clock, tmp_path: Path
) -> None:
    core.record_metrics({"training/global_step": 16, "fully_async/count/current_param_version": 4})
    clock.t = 2000.0
    core.set_knob("trigger_parameter_sync_step", 2, expected_version=0, who="alice@lab")
    # the shells' side: each core's inbox (engine.loop.knobs) takes the changes routed to it
    trainer, rollouter = KnobInbox(TRAINER), KnobInbox(ROLLOUTER)
    assert trainer.take(core.get_knobs()) == [KnobChange("trigger_parameter_sync_step", 2, 1, owned=True)]
    assert trainer.take(core.get_knobs()) == [] and rollouter.take(core.get_knobs()) == []
    clock.t = 2003.0
    assert core.ack_knob("trigger_parameter_sync_step", 1, 17)["ok"]
    knob = core.get_knobs()["trigger_parameter_sync_step"]
    assert (knob["applied_value"], knob["applied_at_step"], knob["pending"]) == (2, 17, False)
    applied = [e for e in read_events(tmp_path) if e.get("phase") == "applied"]
    assert len(applied) == 1
    ev = applied[0]
    assert (ev["kind"], ev["knob"], ev["old"], ev["new"], ev["who"]) == (
        "knob",
        "trigger_parameter_sync_step",
        4,
        2,
        "alice@lab",
    )
    assert (ev["requested_at"], ev["requested_step"], ev["applied_step"], ev["time"]) == (
        2000.0,
        16,
        17,
        2003.0,
    )
    assert "4 → 2" in ev["message"] and "step 17" in ev["message"]
    assert not core.ack_knob("trigger_parameter_sync_step", 1, 18)["ok"]  # already applied


def test_ack_of_an_older_version_keeps_the_newer_pending(core: ControllerCore) -> None:
    core.set_knob("staleness_threshold", 1.0, who="a@h")
    core.set_knob("staleness_threshold", 2.0, who="b@h")
    core.ack_knob("staleness_threshold", 1, 5)
    knob = core.get_knobs()["staleness_threshold"]
    assert (knob["applied_value"], knob["value"], knob["pending"]) == (1.0, 2.0, True)
    core.ack_knob("staleness_threshold", 2, 6)
    assert core.get_knobs()["staleness_threshold"]["pending"] is False


def test_pause_ack_changes_the_run_state(core: ControllerCore) -> None:
    core.set_knob("paused", True, who="a@h")
    assert core.snapshot()["state"] == "running"
    core.ack_knob("paused", 1, 3)
    assert core.snapshot()["state"] == "paused"


def test_no_changes_after_the_run_ended(core: ControllerCore) -> None:
    core.set_state("finished")
    result = core.set_knob("trigger_parameter_sync_step", 2, who="a@h")
    assert not result["ok"] and "finished" in result["reason"]
    assert not core.request_action("checkpoint", who="a@h")["ok"]
    with pytest.raises(ValueError, match="unknown run state"):
        core.set_state("exploded")


def test_actions_are_one_shot_and_collapse(core: ControllerCore, tmp_path: Path) -> None:
    assert core.request_action("checkpoint", who="a@h")["ok"]
    again = core.request_action("checkpoint", who="b@h")
    assert again["ok"] and "already requested by a@h" in again["reason"]
    assert not core.request_action("explode", who="a@h")["ok"]
    assert core.take_actions("rollouter") == []
    assert core.take_actions("trainer", step=9) == ["checkpoint"]
    assert core.take_actions("trainer", step=10) == []
    taken = [
        e for e in read_events(tmp_path) if e.get("action") == "checkpoint" and e.get("phase") == "applied"
    ]
    assert taken[0]["who"] == "a@h" and taken[0]["applied_step"] == 9


def test_every_change_is_a_json_line(core: ControllerCore, tmp_path: Path) -> None:
    core.record_metrics({"training/global_step": 1, "x": float("inf")})
    core.set_knob("paused", True, who="a@h")
    metrics = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[0])["x"] is None  # strict JSON, no Infinity
    kinds = [e["kind"] for e in read_events(tmp_path)]
    assert kinds == ["knob"]


def test_workers_are_merged_and_stamped(core: ControllerCore, clock: Clock) -> None:
    core.update_worker("rollout-0", {"role": "rollout", "state": "running", "weight_version": 1})
    clock.t += 5
    core.update_worker("rollout-0", {"weight_version": 2})
    row = core.snapshot()["workers"]["rollout-0"]
    assert (row["state"], row["weight_version"], row["last_seen"]) == ("running", 2, clock.t)


def test_parse_knob_value_matches_validation() -> None:
    assert parse_knob_value("trigger_parameter_sync_step", " 2 ") == 2
    assert parse_knob_value("staleness_threshold", "0.25") == 0.25
    assert parse_knob_value("paused", "yes") is True
    for name, text in [
        ("trigger_parameter_sync_step", "two"),
        ("trigger_parameter_sync_step", "0"),
        ("paused", "maybe"),
        ("nope", "1"),
    ]:
        with pytest.raises(KnobError):
            parse_knob_value(name, text)
    for spec in KNOB_SPECS.values():
        assert validate_knob_value(spec.name, spec.default) == spec.default
