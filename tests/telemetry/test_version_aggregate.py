"""`logging.aggregate = "version"`: one record per parameter version for TensorBoard / W&B, as verl logs."""

from __future__ import annotations

import pytest

from engine.telemetry.aggregate import VERSION_KEY, VersionAggregatingSink, VersionAggregator, aggregate_records
from engine.telemetry.sinks import build_sinks


def _step(step: int, version: int, synced: bool = False, **extra: float) -> dict:
    rec = {"training/global_step": step, VERSION_KEY: version, "critic/rewards/mean": float(step),
           "actor/grad_norm": 2.0 * step, "timing_s/step": 1.5, "timing_s/gen": 0.5,
           "response_length/max": 10.0 + step, "fully_async/count/stale_trajectory_processed": 3 * step,
           "asyncrl/staleness_hist": {"edges": [0.0, 1.0, 2.0], "counts": [1.0, float(step)]}, **extra}
    if synced:
        rec["timing_s/param_sync"] = 0.25
    return rec


def test_a_sync_cycle_becomes_one_record_at_the_version_it_produced() -> None:
    agg = VersionAggregator()
    # trigger 4: steps 1-3 trained at version 0, step 4 synced (its record already says version 1)
    assert agg.add(_step(1, 0)) == [] and agg.add(_step(2, 0)) == [] and agg.add(_step(3, 0)) == []
    (rec,) = agg.add(_step(4, 1, synced=True))
    assert rec[VERSION_KEY] == 1 and rec["asyncrl/steps_in_version"] == 4
    assert rec["critic/rewards/mean"] == pytest.approx(2.5)  # mean of the per-step values
    assert rec["actor/grad_norm"] == pytest.approx(5.0)
    assert rec["timing_s/step"] == pytest.approx(6.0) and rec["timing_s/param_sync"] == pytest.approx(0.25)
    assert rec["fully_async/trainer/idle_ratio"] == pytest.approx(2.0 / 6.0)
    assert rec["response_length/max"] == 14.0  # max of maxima
    assert rec["fully_async/count/stale_trajectory_processed"] == 12 and rec["training/global_step"] == 4
    assert rec["asyncrl/staleness_hist"]["counts"] == [4.0, 10.0]


def test_validation_passes_through_and_leftover_steps_flush_at_the_end() -> None:
    agg = VersionAggregator()
    assert agg.add({"training/global_step": 4, VERSION_KEY: 1, "val-core/copy/acc/mean@1": 0.5}) == [
        {"training/global_step": 4, VERSION_KEY: 1, "val-core/copy/acc/mean@1": 0.5}]
    agg.add(_step(5, 1))
    agg.add(_step(6, 1))
    (rest,) = agg.flush()
    assert rest[VERSION_KEY] == 2 and rest["asyncrl/steps_in_version"] == 2
    assert agg.flush() == []


def test_per_step_and_per_version_curves_agree_where_the_trigger_differs() -> None:
    """Two runs whose trigger differs still log comparable reward curves per version."""
    fast = aggregate_records([_step(1, 1, synced=True)])
    slow = aggregate_records([_step(1, 0), _step(1, 1, synced=True)])
    assert fast["critic/rewards/mean"] == slow["critic/rewards/mean"]
    assert slow["timing_s/step"] == 2 * fast["timing_s/step"]


class _Collect:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.closed = False

    def write_metrics(self, record: dict) -> None:
        self.records.append(record)

    def write_event(self, event: dict) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_the_wrapping_sink_writes_versions_and_flushes_on_close() -> None:
    inner = _Collect()
    sink = VersionAggregatingSink(inner)
    for rec in (_step(1, 0), _step(2, 1, synced=True), _step(3, 1)):
        sink.write_metrics(rec)
    assert [r[VERSION_KEY] for r in inner.records] == [1]
    sink.close()
    assert [r[VERSION_KEY] for r in inner.records] == [1, 2] and inner.closed


def test_an_unknown_aggregate_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="logging.aggregate"):
        build_sinks(tmp_path, ["jsonl"], aggregate="epoch")
    assert len(build_sinks(tmp_path, ["jsonl"], aggregate="version")) == 1  # jsonl keeps every step
