"""`report.md`: what a user reads in the run directory after a run, rebuilt from the run's own files."""

from __future__ import annotations

import json

from engine.telemetry.run_report import ledger_counts, reward_change, write_report


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn": ')


def _run_dir(tmp_path, *, with_validation=True):
    (tmp_path / "config.resolved.json").write_text(json.dumps(
        {"name": "demo", "async_training": {"mode": "fully_async", "trigger_parameter_sync_step": 2},
         "trainer": {"precision": "bf16", "optim": {"lr": 2e-5}}}))
    (tmp_path / "run.json").write_text(json.dumps({"id": "demo-abc123"}))
    (tmp_path / "machine.json").write_text(json.dumps(
        {"machine": {"cpu": "Some CPU"},
         "choices": [{"key": "trainer.precision", "value": "bf16", "why": "bf16 2.2× fp32 here"}]}))
    steps = [{"training/global_step": k, "critic/rewards/mean": k / 20, "timing_s/step": 10.0 + k % 3,
              "asyncrl/time": 30.0 * k, "fully_async/count/current_param_version": k // 2} for k in range(1, 21)]
    vals = [{"val-core/arith/acc/mean@1": acc, "fully_async/count/current_param_version": v, "asyncrl/time": t}
            for v, t, acc in ((0, 20.0, 0.3), (5, 170.0, 0.6), (10, 300.0, 0.8))] if with_validation else []
    _write_jsonl(tmp_path / "metrics.jsonl", steps + vals)
    _write_jsonl(tmp_path / "events.jsonl", [
        {"kind": "sync", "verified": True, "pause_s": 0.1, "transfer_s": 0.2},
        {"kind": "sync", "verified": 1.0, "pause_s": 0.3, "transfer_s": 0.4},
        {"kind": "sync", "verified": 0.5, "pause_s": 0.2, "transfer_s": 0.3},
        {"kind": "weights", "weights_sha256": "ab" * 32}])
    _write_jsonl(tmp_path / "ledger.jsonl", [
        {"uid": "0:1", "status": "in_flight_at_end"}, {"uid": "0:1", "status": "trained"},
        {"uid": "0:2", "status": "dropped"}, {"uid": "0:3", "status": "trained"}])
    return tmp_path


def test_report_shows_the_curve_timings_settings_and_ledger(tmp_path):
    path = write_report(_run_dir(tmp_path), 0)
    text = path.read_text()
    assert path.name == "report.md"
    assert "outcome: **finished**" in text and "trained 20 steps in 10.0 min (to version 10)" in text
    assert "![validation accuracy](validation.png)" in text
    assert (tmp_path / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "0.300 → 0.800 (+0.500) over 3 validations" in text
    assert "| reward (first → last tenth of the steps) | 0.075 → 0.975 |" in text
    assert "| step time (median) | 11 s |" in text
    assert "| weight syncs | 3 (2 verified), pause 200 ms, transfer 300 ms (medians) |" in text
    assert "| prompts (ledger) | 1 dropped, 2 trained |" in text
    assert "`trainer.precision` → `bf16`: bf16 2.2× fp32 here" in text and "Chosen on Some CPU" in text
    assert "| `async_training.trigger_parameter_sync_step` | `2` |" in text


def test_a_failed_run_says_so_and_a_run_without_validation_has_no_plot(tmp_path):
    text = write_report(_run_dir(tmp_path, with_validation=False), 1).read_text()
    assert "outcome: **failed (exit 1)**" in text and "No validation ran." in text
    assert not (tmp_path / "validation.png").exists()


def test_reward_change_and_ledger_counts():
    assert reward_change([1.0]) is None
    assert reward_change([0.0] * 10 + [1.0] * 10) == (0.0, 1.0)
    assert ledger_counts([{"uid": 1, "status": "dropped"}, {"uid": 1, "status": "trained"}]) == {"trained": 1}
