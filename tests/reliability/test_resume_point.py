"""Choosing the checkpoint to resume from, refusing an incompatible one, and rewinding the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reliability_helpers import read_jsonl, tiny_config

from engine.persist.checkpoint import ledger_position, list_checkpoints, write_checkpoint
from engine.persist.resume import ResumeError, config_fingerprint, find_resume_point, rewind_run_dir


def _line(obj: dict) -> str:
    return json.dumps(obj) + "\n"


def _checkpoint(cfg, run_dir: Path, step: int) -> Path:
    state = {"step": step, "version": step, "since_sync": 0, "reason": "periodic", "run_dir": str(run_dir),
             "fingerprint": config_fingerprint(cfg), **ledger_position(run_dir / "ledger.jsonl")}

    def save_trainer(path: Path) -> None:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"weights")

    return write_checkpoint(run_dir / "checkpoints", step, save_trainer=save_trainer, state=state, queued=[],
                            in_flight=[], keep_last=5)


def _train(run_dir: Path, steps: range) -> None:
    with (run_dir / "ledger.jsonl").open("a") as led, (run_dir / "metrics.jsonl").open("a") as met:
        for s in steps:
            led.write(_line({"uid": f"0:{s}", "status": "trained", "step": s, "version": s}))
            met.write(_line({"training/global_step": s, "critic/rewards/mean": 0.5}))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    return d


def test_auto_starts_a_new_run_only_when_there_is_nothing_to_resume(run_dir: Path) -> None:
    cfg = tiny_config(run_dir)
    assert find_resume_point(cfg, "auto") is None
    _train(run_dir, range(1, 3))
    with pytest.raises(ResumeError, match="never checkpointed"):
        find_resume_point(cfg, "auto")


def test_resume_rewinds_the_ledger_and_metrics_to_the_checkpoint(run_dir: Path) -> None:
    cfg = tiny_config(run_dir)
    _train(run_dir, range(1, 3))
    ckpt = _checkpoint(cfg, run_dir, 2)
    _train(run_dir, range(3, 5))  # trained after the checkpoint, then the driver died ...
    with (run_dir / "ledger.jsonl").open("a") as f:
        f.write('{"uid": "0:5", "sta')  # ... in the middle of a line
    with (run_dir / "events.jsonl").open("w") as f:
        f.write(_line({"kind": "sync", "step": 4}) + '{"kind": "sy')
    (run_dir / "metrics.jsonl").open("a").write(_line({"asyncrl/time": 1.0}))  # a record without a step

    point = find_resume_point(cfg, "auto")
    assert point is not None and point.ckpt["path"] == str(ckpt) and point.step == 2
    counts = rewind_run_dir(point)
    assert counts == {"ledger_lines": 2, "metric_records": 2, "set_aside": 0}
    assert [e["uid"] for e in read_jsonl(run_dir / "ledger.jsonl")] == ["0:1", "0:2"]
    assert [e["uid"] for e in read_jsonl(run_dir / "ledger.rolled_back.jsonl")] == ["0:3", "0:4"]
    assert [r.get("training/global_step") for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, None]
    assert read_jsonl(run_dir / "events.jsonl") == [{"kind": "sync", "step": 4}]  # history kept, torn line gone
    assert rewind_run_dir(find_resume_point(cfg, "auto")) == {"ledger_lines": 0, "metric_records": 0, "set_aside": 0}


def test_corrupt_newest_is_skipped_and_newer_timelines_are_set_aside(run_dir: Path) -> None:
    cfg = tiny_config(run_dir)
    _train(run_dir, range(1, 3))
    _checkpoint(cfg, run_dir, 2)
    _train(run_dir, range(3, 5))
    newest = _checkpoint(cfg, run_dir, 4)
    (newest / "state.json").write_text("{}")
    point = find_resume_point(cfg, "auto")
    assert point.step == 2 and [Path(p).name for p, _ in point.skipped] == ["global_step_4"]
    assert rewind_run_dir(point)["set_aside"] == 1
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["global_step_2"]


def test_an_explicit_checkpoint_must_be_intact(run_dir: Path) -> None:
    cfg = tiny_config(run_dir)
    ckpt = _checkpoint(cfg, run_dir, 2)
    assert find_resume_point(cfg, str(ckpt)).step == 2
    assert find_resume_point(cfg, str(run_dir)).step == 2
    (ckpt / "queued.json").unlink()
    with pytest.raises(ResumeError, match="queued.json is missing"):
        find_resume_point(cfg, str(ckpt))
    with pytest.raises(ResumeError, match="no checkpoint at"):
        find_resume_point(cfg, str(run_dir / "nowhere"))


def test_a_checkpoint_needs_the_same_model_data_and_group_size(run_dir: Path) -> None:
    _checkpoint(tiny_config(run_dir), run_dir, 2)
    with pytest.raises(ResumeError, match=r"rollout\.n is 2 here but was 4"):
        find_resume_point(tiny_config(run_dir, "rollout.n=2"), "auto")
    with pytest.raises(ResumeError, match=r"data\.seed is 7 here but was 0"):
        find_resume_point(tiny_config(run_dir, "data.seed=7"), "auto")
    assert find_resume_point(tiny_config(run_dir, "trainer.optim.lr=1e-5"), "auto").step == 2  # others may change


def test_a_run_directory_that_is_not_the_checkpoints_is_refused(run_dir: Path) -> None:
    cfg = tiny_config(run_dir)
    _train(run_dir, range(1, 3))
    _checkpoint(cfg, run_dir, 2)
    (run_dir / "ledger.jsonl").write_text(_line({"uid": "9:9", "status": "trained"}) * 2)
    with pytest.raises(ResumeError, match="does not belong to this checkpoint"):
        find_resume_point(cfg, "auto")


def test_the_resume_line_says_whose_weights_the_replicas_get_between_two_syncs() -> None:
    """A checkpoint one step past a sync: with the version's weights the replicas get them; without (bypass mode
    outside deterministic mode keeps none) the line says plainly that they continue with the step's."""
    from engine.persist.resume import ResumePoint, resume_message

    def line(**state) -> str:
        ckpt = {"path": "ck/global_step_7", "queued": [], "in_flight": [],
                "state": {"step": 7, "version": 3, "since_sync": 1, **state}}
        return resume_message(ResumePoint(ckpt, Path("r")), {"ledger_lines": 0, "metric_records": 0}, False)

    assert "the replicas get version 3's own weights" in line(version_weights=True)
    assert "the replicas continue with the weights of step 7, not version 3's" in line(version_weights=False)
    assert "replicas" not in line(since_sync=0)  # at a sync the trainer's weights are the version's
