"""The plan's cost model: the estimate from config.json + hardware, calibration from a recorded run, and
the costed simulator (default costs = World exactly; per-row decode cost; abort at a step boundary)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from asyncrl_cli.config.loader import analyze_run_config
from engine.loop.sim.costed import CostedScenario, CostedWorld
from engine.loop.sim.runner import run_scenario, scenario_seeds
from engine.loop.sim.scenario import draw
from engine.predict.calibrate import CalibrationError, calibrate
from engine.predict.costs import ETA_BW, CostsUnavailable, Layout, resolve
from engine.predict.prediction import simulate, sync_layout

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "presets" / "runs" / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"


def _layout(path: Path) -> tuple[Layout, object]:
    an = analyze_run_config(path)
    assert an.config is not None
    return Layout.from_config(an.config, an.derived.total_train_steps, an.hardware.device), an


def test_costed_world_with_default_costs_is_exactly_the_simulator() -> None:
    names = {f.name for f in dataclasses.fields(draw(0))}
    for seed in list(scenario_seeds(60, 3)):
        s = draw(seed)
        base = run_scenario(s)
        if base.violations:
            continue
        cs = CostedScenario(**{n: getattr(s, n) for n in names})
        out = CostedWorld(cs).run()
        assert (out.sim_time, out.steps, out.versions, out.staleness) == \
            (base.sim_time, base.steps, base.versions, base.staleness), seed


def _one_dispatch(**kw: float) -> float:
    s = CostedScenario(seed=5, n=4, ppo_mini_batch_size=1, trigger=1, mode="sync", replicas=1, seqs_per_call=4,
                       total_prompts=1, max_new_tokens=40, long_tail=0.0, token_cost=0.01, train_token_cost=0.0,
                       sync_cost=0.0, short_max=40, **kw)
    w = CostedWorld(s)
    out = w.run()
    assert out.finished and not out.violations
    return out.rollout_busy_s, [w._length(f"p0-0#{i}") for i in range(4)]


def test_a_decode_step_costs_more_with_more_running_rows() -> None:
    base, lengths = _one_dispatch()
    assert base == pytest.approx(max(lengths) * 0.01)
    busy, _ = _one_dispatch(row_cost=0.001)
    assert busy == pytest.approx(max(lengths) * 0.01 + 0.001 * sum(lengths))  # rows leave as they finish
    busy, _ = _one_dispatch(prefill_cost=0.002, prompt_tokens=10)
    assert busy == pytest.approx(0.002 * 4 * 10 + max(lengths) * 0.01)


def test_estimate_follows_the_stated_formulas_for_the_seed_layout() -> None:
    layout, an = _layout(SEED)
    costs = resolve(layout, an.model, an.hardware)
    p_tot = an.model.params_total
    assert costs.decode_step_s == pytest.approx(2 * p_tot / (4 * 4000e9 * ETA_BW))
    # the weight sync is the engine's pipeline: the 400 Gb/s link of the sender dominates (61 GB → 1.36 s), the
    # EP gather to the sender and the replicas' load overlap with it (1 / 114 buckets of them is not hidden)
    nbytes = 2 * p_tot
    transfer, load = nbytes / 45e9, 2 * nbytes / (4000e9 * ETA_BW)
    gather = nbytes * (1 - 1 / (layout.trainer_model_parallel * layout.trainer_ep)) / 150e9
    n = -(-int(nbytes) // (512 * 2**20))
    assert costs.sync_s == pytest.approx(transfer + (gather + load) / n)
    assert costs.sync_s <= 10.0  # the target for seed 000 (verl: 4.4 s on H20)
    assert any(n.startswith("weight sync ") and "transfer_s" in n and "gather_s" in n for n in costs.notes)
    assert all(src == "estimate" for k, src in costs.sources.items() if k not in ("long_tail", "short_max"))
    assert any("η_bw" in n for n in costs.notes)


def test_the_train_step_counts_a_groups_prompt_once_where_the_trainer_shares_it() -> None:
    """`trainer.shared_prompt` (torch / FSDP2): a group's prompt is trained once instead of n times when the
    packed group pays and its mask fits (`engine.plan.prompt_sharing`); a long-row layout keeps n copies."""
    layout, an = _layout(SEED)
    cfg = an.config
    short = Layout.from_config(cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_response_length": 64})}),
                               layout.total_versions, layout.device)
    padded = resolve(short, an.model, an.hardware)
    shared = resolve(dataclasses.replace(short, shared_prompt=True), an.model, an.hardware)
    saved = (short.n - 1) * short.required_samples * short.prompt_tokens * padded.train_token_s
    assert shared.train_token_s == padded.train_token_s
    assert padded.train_step_s - shared.train_step_s == pytest.approx(saved)
    long_rows = dataclasses.replace(layout, shared_prompt=True)  # the seed's 8k-token responses: L² mask too large
    assert resolve(long_rows, an.model, an.hardware).train_step_s == resolve(layout, an.model, an.hardware).train_step_s


def test_a_builtin_model_without_calibration_has_no_cost_source() -> None:
    layout, an = _layout(ROOT / "presets" / "runs" / "tiny-cpu.toml")
    with pytest.raises(CostsUnavailable, match="--calibrate"):
        resolve(layout, an.model, an.hardware)


def test_calibration_recovers_the_recorded_costs_and_reproduces_the_run(run_dir: Path) -> None:
    layout, _ = _layout(ROOT / "presets" / "runs" / "tiny-cpu-sync.toml")
    cal = calibrate(run_dir, layout)
    c, m = cal["costs"], cal["measured"]
    assert c["train_step_s"] == pytest.approx(0.5) and c["train_token_s"] == 0.0
    assert c["sync_s"] == pytest.approx(0.04)
    assert c["long_tail"] == pytest.approx(0.5)
    assert m["steps"] == 20 and m["step_time_s"] == pytest.approx(0.75)
    costs = resolve(dataclasses.replace(layout, device="cuda"), calibration=cal)
    p = simulate(dataclasses.replace(layout, device="cuda", total_versions=None), costs)
    busy = (1 - p.rollout_idle_ratio) * layout.replicas * p.version_time_s
    assert busy == pytest.approx(0.2, rel=0.02)  # the decode cost reproduces the rollouter's active time
    assert p.version_time_s == pytest.approx(0.5 + 0.2 + 0.04, rel=0.03)  # sync: gen, train, sync in turn


def test_calibration_fits_a_per_token_training_cost_when_lengths_vary(tmp_path: Path, make_run_dir) -> None:
    layout, _ = _layout(ROOT / "presets" / "runs" / "tiny-cpu-sync.toml")
    d = make_run_dir(tmp_path / "r", busy=0.1, token_cost=1e-4, steps=30)
    c = calibrate(d, layout)["costs"]
    assert c["train_token_s"] == pytest.approx(1e-4, rel=0.01)
    assert c["train_step_s"] == pytest.approx(0.1, abs=0.005)


def test_calibration_of_a_directory_without_metrics_is_one_clear_error(tmp_path: Path) -> None:
    layout, _ = _layout(ROOT / "presets" / "runs" / "tiny-cpu-sync.toml")
    with pytest.raises(CalibrationError, match="metrics.jsonl"):
        calibrate(tmp_path, layout)


def test_async_overlaps_what_sync_serialises_on_separate_devices(run_dir: Path) -> None:
    layout, _ = _layout(ROOT / "presets" / "runs" / "tiny-cpu.toml")
    gpu = dataclasses.replace(layout, device="cuda", total_versions=None)
    costs = resolve(gpu, calibration=calibrate(run_dir, gpu))
    slow = simulate(sync_layout(gpu), costs)
    # staleness 0.5 on one replica that takes the whole budget in one dispatch: after each sync the trainer
    # holds 16 of its 32 prompts and waits for the dispatch that brings the rest — no overlap at all
    same = simulate(gpu, costs)
    assert same.samples_per_s == pytest.approx(slow.samples_per_s, rel=0.02)
    fast = simulate(dataclasses.replace(gpu, loop=gpu.loop.with_knobs(staleness_threshold=1.0)), costs)
    # (staleness 1: a whole step's prompts wait at each sync)
    assert fast.samples_per_s > 1.2 * slow.samples_per_s  # train 0.5 s and gen 0.2 s overlap
    assert fast.rollout_idle_ratio > fast.trainer_idle_ratio  # the trainer is the bottleneck
    cpu = simulate(dataclasses.replace(gpu, device="cpu"), costs)
    assert cpu.samples_per_s < fast.samples_per_s and cpu.cpu_contention
    assert math.isclose(sum(fast.staleness_hist.values()), 4 * 32)  # 4 measured versions of 32 prompts


class _Recorded(CostedWorld):
    """A costed world that records, at each training step's start, whether a dispatch was in flight."""

    def __init__(self, s: CostedScenario) -> None:
        self.overlaps: list[bool] = []
        super().__init__(s)

    def _at(self, t: float, kind: str, args: tuple) -> None:
        if kind == "trained":
            self.overlaps.append(self._generating())
        super()._at(t, kind, args)


def test_on_shared_accelerators_no_training_step_runs_while_a_replica_generates() -> None:
    """verl's colocate baseline (`exclusive`): the trainer's step waits until the last dispatch of the version
    is back; asyncrl's sync mode on its own pools starts its first step as soon as that step's groups are."""
    def run(exclusive: bool) -> tuple[_Recorded, float]:
        s = CostedScenario(seed=5, n=4, ppo_mini_batch_size=1, trigger=2, mode="sync", replicas=2, seqs_per_call=4,
                           total_prompts=8, max_new_tokens=40, long_tail=0.0, token_cost=0.01,
                           train_token_cost=0.002, sync_cost=0.0, short_max=40, exclusive=exclusive)
        w = _Recorded(s)
        out = w.run()
        assert out.finished and not out.violations and out.steps == 8
        return w, out.sim_time

    own_pools, t_own = run(False)
    shared, t_shared = run(True)
    assert any(own_pools.overlaps)  # a step trained beside a replica still generating
    assert shared.overlaps and not any(shared.overlaps)
    assert t_shared > t_own  # the overlap is gone from the shared accelerators' time


def test_holding_steps_for_shared_accelerators_never_stalls_a_run_with_faults() -> None:
    """The hold is the shell's, over any scenario the simulator draws (replica and trainer deaths, knob changes,
    async and sync): no violation, no deadlock, and every run ends as it does without the hold."""
    names = {f.name for f in dataclasses.fields(draw(0))}
    faulted = 0
    for seed in list(scenario_seeds(40, 3)):
        s = draw(seed)
        kw = {n: getattr(s, n) for n in names}
        free, held = CostedWorld(CostedScenario(**kw)).run(), CostedWorld(CostedScenario(**kw, exclusive=True)).run()
        faulted += bool(s.replica_deaths or s.trainer_deaths)
        assert not held.violations, (seed, held.violations[:1])
        assert (held.finished, held.failure) == (free.finished, free.failure), seed
    assert faulted >= 10


def test_plan_sync_term_uses_the_export_bytes_formula() -> None:
    """Issue 43: `asyncrl plan`'s sync term moves P·b_r (`engine.plan.memory.sync_bytes`), the bytes the export
    yields: Qwen3-VL-8B in bf16 is 17.5 GB per sync (not the 35 GB of fp32 masters); an fp32 rollout doubles it."""
    from engine.plan.memory import sync_bytes
    from engine.predict.costs import sync_pipeline

    vl = ROOT / "presets" / "runs" / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml"
    layout, an = _layout(vl)
    assert layout.sync_param_bytes == 2
    p = an.model.params_total
    _, terms = sync_pipeline(p, layout, an.hardware.interconnect, an.hardware.memory_bandwidth_gbs * 1e9)
    assert terms["bytes_gb"] == pytest.approx(sync_bytes(p, 2) / 1e9) and 17.0 < terms["bytes_gb"] < 18.0
    fp32, _ = _layout_set(vl, ['rollout.dtype="fp32"'])
    _, terms32 = sync_pipeline(p, fp32, an.hardware.interconnect, an.hardware.memory_bandwidth_gbs * 1e9)
    assert terms32["bytes_gb"] == pytest.approx(2 * terms["bytes_gb"])


def _layout_set(path: Path, sets: list[str]) -> tuple[Layout, object]:
    an = analyze_run_config(path, sets)
    assert an.config is not None, [p.render() for p in an.problems]
    return Layout.from_config(an.config, an.derived.total_train_steps, an.hardware.device), an
