"""ReplaySource: a run directory in the controller's snapshot shape; tails growing files; read-only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.control.client import (
    LocalSource,
    MetricsSource,
    ReadOnlySource,
    ReplaySource,
    RunNotFoundError,
)
from engine.control.core import ControllerCore

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_tiny"


def lines(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIXTURE / name).read_text().splitlines() if x.strip()]


def test_replay_serves_every_record_and_event_once() -> None:
    source = ReplaySource(FIXTURE)
    snap = source.snapshot(0)
    assert snap["metrics"] == lines("metrics.jsonl")
    assert snap["events"] == lines("events.jsonl")
    assert snap["cursor"] == len(snap["metrics"]) + len(snap["events"])
    again = source.snapshot(snap["cursor"])
    assert again["metrics"] == [] and again["events"] == [] and again["cursor"] == snap["cursor"]
    assert source.snapshot(0, limit=3)["metrics"] == snap["metrics"][-3:]


def test_replay_rebuilds_run_info_state_and_knobs() -> None:
    snap = ReplaySource(FIXTURE).snapshot(0)
    events, metrics = lines("events.jsonl"), lines("metrics.jsonl")
    finish = [e for e in events if e["kind"] == "finish"]
    if finish:
        assert snap["state"] in ("finished", "failed")
    assert snap["run"]["started_at"] == events[0]["time"]
    assert snap["now"] >= metrics[-1]["asyncrl/time"] + snap["run"]["started_at"] - 1e-6
    applied = [
        e
        for e in events
        if e.get("kind") == "knob"
        and e.get("phase") == "applied"
        and e.get("knob") == "trigger_parameter_sync_step"
    ]
    knob = snap["knobs"]["trigger_parameter_sync_step"]
    if applied:
        assert knob["applied_value"] == applied[-1]["new"]
        assert knob["applied_at_step"] == applied[-1]["applied_step"]
        assert knob["requested_by"] == applied[-1]["who"]
    trainer = snap["workers"]["trainer"]
    assert trainer["tokens_per_s"] == metrics[-1]["asyncrl/trainer/tokens_per_s"]


def test_replay_tails_a_growing_run_and_ignores_a_partial_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"training/global_step": 1}\n{"training/glo')
    source = ReplaySource(run)
    first = source.snapshot(0)
    assert [m["training/global_step"] for m in first["metrics"]] == [1]
    with open(run / "metrics.jsonl", "a") as f:
        f.write('bal_step": 2}\nnot json\n')
    second = source.snapshot(first["cursor"])
    assert [m["training/global_step"] for m in second["metrics"]] == [2]
    assert source.bad_lines == 1
    assert second["state"] == "running"  # just written, no finish event


def test_replay_refuses_mutations() -> None:
    source = ReplaySource(FIXTURE)
    assert source.read_only
    assert source.set_knob("trigger_parameter_sync_step", 2)["ok"] is False
    assert "read-only" in source.request_action("checkpoint")["reason"]


def test_replay_of_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError, match="does not exist"):
        ReplaySource(tmp_path / "missing")
    with pytest.raises(RunNotFoundError, match="is it a run directory"):
        ReplaySource(tmp_path)


def test_plain_config_shape_is_accepted(tmp_path: Path) -> None:
    shutil.copy(FIXTURE / "metrics.jsonl", tmp_path / "metrics.jsonl")
    (tmp_path / "config.resolved.json").write_text(
        json.dumps({"name": "plain", "async_training": {"trigger_parameter_sync_step": 8}})
    )
    snap = ReplaySource(tmp_path).snapshot(0)
    assert snap["run"]["name"] == "plain"
    assert snap["knobs"]["trigger_parameter_sync_step"]["value"] == 8
    assert snap["run"]["provenance"] == {}


def test_sources_satisfy_the_protocol_and_read_only_wrapper_refuses() -> None:
    core = ControllerCore("t", sinks=[])
    local = LocalSource(core, who="op@h")
    for source in (ReplaySource(FIXTURE), local, ReadOnlySource(local)):
        assert isinstance(source, MetricsSource)
    guarded = ReadOnlySource(local)
    assert not guarded.set_knob("trigger_parameter_sync_step", 2)["ok"]
    assert not guarded.request_action("stop")["ok"]
    assert core.get_knobs()["trigger_parameter_sync_step"]["version"] == 0
    assert local.set_knob("trigger_parameter_sync_step", 2)["ok"]
    assert core.get_knobs()["trigger_parameter_sync_step"]["requested_by"] == "op@h"


def test_replica_events_in_the_engines_shape_become_worker_rows(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"training/global_step": 1, "asyncrl/rollout/tokens_per_s": 50.0}) + "\n"
    )
    events = [
        {
            "time": 1.0,
            "kind": "replica",
            "level": "warning",
            "message": "died",
            "replica": 1,
            "phase": "restart",
        },
        {"time": 2.0, "kind": "sync", "level": "info", "message": "v1", "step": 1, "version": 1},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    workers = ReplaySource(tmp_path).snapshot(0)["workers"]
    assert workers["rollout-1"]["state"] == "restarting"
    assert (
        workers["rollout (all)"]["tokens_per_s"] == 50.0 and workers["rollout (all)"]["weight_version"] == 1
    )


def test_plain_config_takes_provenance_from_the_file_launch_writes(tmp_path: Path) -> None:
    """A real run and a dry run both write `config.provenance.json` beside the resolved config; replay reads it."""
    shutil.copy(FIXTURE / "metrics.jsonl", tmp_path / "metrics.jsonl")
    (tmp_path / "config.resolved.json").write_text(json.dumps({"name": "plain"}))
    prov = {"keys": {"name": {"where": "run.toml:1"}}}
    (tmp_path / "config.provenance.json").write_text(json.dumps(prov))
    assert ReplaySource(tmp_path).snapshot(0)["run"]["provenance"] == prov
