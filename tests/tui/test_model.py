"""Pure parts of the dashboard: snapshot folding and coalescing, derived numbers, change plans, formatting."""

from __future__ import annotations

import pytest

from asyncrl_cli.tui.format import fmt_duration, fmt_num, fmt_rate
from asyncrl_cli.tui.knob_change import describe_knob_change, max_queue
from asyncrl_cli.tui.model import DashboardModel
from asyncrl_cli.tui.poller import SnapshotBuffer, next_cursor
from asyncrl_cli.tui.widgets.config_view import provenance_of
from asyncrl_cli.tui.widgets.ticks import thin_ticks


def snap(
    cursor: int, metrics: list[dict] | None = None, events: list[dict] | None = None, **extra: object
) -> dict:
    return {
        "cursor": cursor,
        "metrics": metrics or [],
        "events": events or [],
        "knobs": {},
        "workers": {},
        "run": {},
        "state": "running",
        "now": 0.0,
        **extra,
    }


def test_buffer_merges_deltas_so_nothing_is_lost() -> None:
    buf = SnapshotBuffer()
    buf.put(snap(2, [{"training/global_step": 1}], state="running"))
    buf.put(snap(4, [{"training/global_step": 2}], [{"kind": "sync"}], state="paused"))
    merged, reset = buf.drain()
    assert merged is not None and not reset
    assert [m["training/global_step"] for m in merged["metrics"]] == [1, 2]
    assert merged["events"] == [{"kind": "sync"}]
    assert (merged["cursor"], merged["state"]) == (4, "paused")
    assert buf.drain() == (None, False)
    buf.put(snap(9, [{"training/global_step": 3}]))
    buf.put(snap(1, [{"training/global_step": 1}]), reset=True)
    merged, reset = buf.drain()
    assert reset and [m["training/global_step"] for m in merged["metrics"]] == [1]


def test_cursor_going_backwards_means_the_source_restarted() -> None:
    assert next_cursor(10, {"cursor": 12}) == (12, False)
    assert next_cursor(10, {"cursor": 3}) == (3, True)


def test_model_latest_series_histogram_and_eta() -> None:
    model = DashboardModel()
    records = [
        {"training/global_step": 1, "x": 1.0, "h": {"edges": [0, 1, 2], "counts": [1, 0]}},
        {
            "training/global_step": 2,
            "x": None,
            "asyncrl/sync/pause_s": 0.1,
            "h": {"edges": [0, 1, 2], "counts": [0, 2]},
        },
        {"training/global_step": 3, "x": 3.0, "h": {"edges": [0, 1, 2], "counts": [3, 0]}},
    ]
    _, _, changed = model.apply(snap(3, records, run={"started_at": 100.0, "total_steps": 6}, now=130.0))
    assert changed
    assert model.latest("x") == 3.0 and model.latest("asyncrl/sync/pause_s") == 0.1
    assert model.series("x") == ([1.0, 3.0], [1.0, 3.0])
    assert model.histogram("h", window=2) == ([0, 1, 2], [3.0, 2.0])
    assert model.histogram("missing") is None
    assert model.elapsed == 30.0 and model.eta == pytest.approx(30.0)  # 3 steps left at 10 s/step
    assert model.apply(snap(3, run={"started_at": 100.0, "total_steps": 6}, now=130.0))[2] is False


def test_policy_version_prefers_the_latest_sync_event() -> None:
    model = DashboardModel()
    model.apply(
        snap(
            2,
            [{"training/global_step": 4, "fully_async/count/current_param_version": 1}],
            [{"kind": "sync", "version": 2}],
        )
    )
    assert model.policy_version == 2


def test_worker_rows_accept_the_engines_field_names() -> None:
    model = DashboardModel()
    model.apply(
        snap(
            1,
            [{"fully_async/count/current_param_version": 5}],
            workers={
                "rollout-0": {"id": "rollout-0", "kind": "rollout", "version": 3},
                "trainer-0": {"id": "trainer-0", "role": "trainer", "weight_version": 5},
            },
        )
    )
    rows = model.worker_rows()
    assert [r["id"] for r in rows] == ["trainer-0", "rollout-0"]
    assert (rows[1]["role"], rows[1]["weight_version"], rows[1]["lag"]) == ("rollout", 3, 2)


def test_knob_confirmation_states_old_new_and_the_budget() -> None:
    config = {"trainer": {"ppo_mini_batch_size": 4}, "async_training": {"require_batches": 1}}
    knobs = {"trigger_parameter_sync_step": {"value": 4}, "staleness_threshold": {"value": 0.5}}
    assert max_queue(config, 0.5, 4) == 24  # 4 × 1 × 1.5 × 4
    ask = describe_knob_change("trigger_parameter_sync_step", 4, 8, config, knobs)
    assert "4 → 8" in ask.body and "24 → 48" in ask.body and ask.warnings
    ask = describe_knob_change("staleness_threshold", 0.5, 0.0, config, knobs)
    assert "24 → 16" in ask.body and "one sync cycle" in ask.warnings[0]
    assert describe_knob_change("paused", False, True, {}, knobs).title == "Pause generation?"


def test_provenance_lookup_follows_parents_and_both_shapes() -> None:
    loader_shape = {"keys": {"trainer.optim": {"where": "run.toml:7", "source": "run.toml"}}}
    assert provenance_of(loader_shape, "trainer.optim.lr") == "run.toml:7"
    assert provenance_of({"name": "a.toml:1"}, "name") == "a.toml:1"
    assert provenance_of({}, "model.path") == "default"


def test_ticks_are_thinned_to_fit_and_keep_the_latest() -> None:
    positions = [float(i) for i in range(1, 13)]
    labels = [str(10 + 2 * i) for i in range(12)]
    kept, names = thin_ticks(positions, labels, width=16)
    assert len(kept) <= 4 and names[-1] == "32"
    assert thin_ticks(positions, labels, width=200) == (positions, labels)


def test_formatting() -> None:
    assert (fmt_rate(950), fmt_rate(1350.0), fmt_rate(None)) == ("950", "1.35k", "—")
    assert (fmt_duration(42), fmt_duration(185), fmt_duration(7620)) == ("42s", "3m05s", "2h07m")
    assert (fmt_num(2.0), fmt_num(0.94581), fmt_num(float("nan"))) == ("2", "0.946", "—")


def test_step_time_is_the_recent_mean_and_the_plan_comes_from_the_run_info() -> None:
    from asyncrl_cli.tui.widgets.kpi_row import step_time_kpi

    model = DashboardModel()
    model.apply(snap(1, [{"training/global_step": i, "timing_s/step": 9.0 if i < 5 else 0.5} for i in range(1, 30)]))
    assert model.step_time() == pytest.approx(0.5)  # the last 20 steps: warm-up steps no longer count
    assert model.planned_step_time() is None
    assert step_time_kpi(model) == ("0.5 s", "")
    model.apply(snap(2, run={"plan": {"step_time_s": 0.4}}))
    assert model.planned_step_time() == pytest.approx(0.4)
    assert step_time_kpi(model) == ("0.5 / 0.4 +25%", "")
    model.apply(snap(3, [{"training/global_step": 30 + i, "timing_s/step": 0.7} for i in range(20)],
                     run={"plan": {"step_time_s": 0.4}}))
    assert step_time_kpi(model) == ("0.7 / 0.4 +75%", "alert")  # drifting far from the expectation
    model.apply(snap(4, [{"training/global_step": 60 + i, "timing_s/step": 0.54} for i in range(20)],
                     run={"plan": {"step_time_s": 0.4}}))
    assert step_time_kpi(model) == ("0.54 / 0.4 +35%", "warn")


def test_the_header_shows_the_newest_validations_core_mean_at_n_once_there_is_one() -> None:
    from asyncrl_cli.tui.widgets.run_header import header_text

    model = DashboardModel()
    model.apply(snap(1, [{"training/global_step": 1, "timing_s/step": 1.0}]))
    assert model.validation() is None and " val " not in header_text(model, "local", False).plain
    model.apply(snap(2, [{"fully_async/count/current_param_version": 2, "val-core/a/acc/mean@4": 0.5,
                          "val-core/a/acc/best@4/mean": 0.9, "val-core/b/reward/mean@4": 0.25},
                         {"training/global_step": 2, "timing_s/step": 1.0}]))
    assert model.validation() == (0.375, 4)  # the mean over the sources, never best@k
    assert " · val 0.375 mean@4 · " in header_text(model, "local", False).plain
    model.apply(snap(3, [{"val-core/a/acc/mean@4": 0.75, "val-core/a/reward/mean@4": 0.1}]))
    assert model.validation() == (0.75, 4)  # acc preferred over reward
