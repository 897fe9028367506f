"""`"auto"` precision and threads: the decision is a pure function of the measurement (each outcome forced here);
the launch-time glue (`engine.launch.probe.resolve_auto`) decides from the per-machine cache, prints one line per
setting and returns a plan of concrete values; the measurement itself times real matmuls."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl_cli.config import load_run_config
from engine.config.schema import RunConfig
from engine.plan import auto
from engine.plan.machine import parse_cpuinfo
from engine.plan.run_plan import resolve_plan

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "presets" / "runs" / "smollm2-arith-cpu.toml"
SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152, "num_attention_heads": 9,
           "num_key_value_heads": 3}


def demo(*overrides: str) -> RunConfig:
    res = load_run_config(DEMO, list(overrides))
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def test_bf16_is_chosen_only_where_it_is_measurably_faster() -> None:
    fast = auto.choose_precision("trainer", fp32_s=1.8, bf16_s=1.0)
    assert (fast.key, fast.value) == ("trainer.precision", "bf16")
    assert fast.line() == "trainer.precision auto: bf16 1.80× fp32 here (bf16 from 1.1×) → bf16"
    slow = auto.choose_precision("rollout", fp32_s=0.6, bf16_s=1.0)  # a Xeon without AMX: bf16 0.6× fp32
    assert (slow.key, slow.value, slow.ratio) == ("rollout.dtype", "fp32", 0.6)
    assert "0.60× fp32" in slow.line() and slow.line().endswith("→ fp32")
    assert auto.choose_precision("trainer", 1.05, 1.0).value == "fp32"  # a tie goes to fp32 (bf16 costs accuracy)


def test_a_pool_takes_every_core_only_where_its_matmuls_scale() -> None:
    scales = auto.choose_threads("trainer", one_s=1.9, all_s=1.0, cores=2, share=1)
    assert (scales.key, scales.value) == ("resources.trainer.cpu_threads", 2)
    flat = auto.choose_threads("trainer", one_s=1.05, all_s=1.0, cores=2, share=1)  # busy or memory-bound cores
    assert flat.value == 1 and "1.05×" in flat.line()


def test_accelerators_choose_bf16_without_measuring() -> None:
    choices = auto.decide_precision(demo(), "cuda", None)
    assert [(c.key, c.value, c.ratio) for c in choices] == [("trainer.precision", "bf16", None),
                                                             ("rollout.dtype", "bf16", None)]
    threads = auto.decide_threads(demo(), "cuda", None, cores=64, split={"trainer": 4, "rollout": 4})
    assert [(c.key, c.value) for c in threads] == [("resources.trainer.cpu_threads", 0)]


def test_the_roles_decide_from_their_own_shapes() -> None:
    times = {"trainer": {"fp32": 1.0, "bf16": 2.0}, "lm_head": {"fp32": 1.0, "bf16": 1.0},  # trainer: 0.67×
             "decode": {"fp32": 1.0, "bf16": 0.5}, "decode_head": {"fp32": 3.0, "bf16": 1.0}}  # rollout: 2.67×
    equal = dict.fromkeys(times, 1.0)
    by_key = {c.key: c.value for c in auto.decide_precision(demo(), "cpu", times, equal)}
    assert by_key == {"trainer.precision": "fp32", "rollout.dtype": "bf16"}
    fixed = demo("trainer.precision=\"fp32\"", "rollout.dtype=\"bf16\"")
    assert auto.decide_precision(fixed, "cpu", times, equal) == []  # only "auto" settings are decided


def test_a_roles_time_weighs_each_shape_by_its_share_of_the_step() -> None:
    """An Intel Xeon with AMX as measured at a demo launch: bf16 ran the layer shape 2.8× fp32 but the 64-row LM
    head 0.84×; the layers are most of the trainer's matmuls, so bf16 is chosen (the unweighted sum said 0.93×)."""
    cfg = demo()
    arch = {**SMOLLM2, "num_hidden_layers": 30}
    shapes = auto.probe_shapes(cfg, arch)
    weights = auto.step_weights(cfg, arch, shapes)
    # one layer's matmuls = 4 of the 576 × 1536 shape (q, o: 576²; k, v: 576 × 192; 3 × 576 × 1536), 30 layers
    assert weights["trainer"] * shapes["trainer"][0] == pytest.approx(30 * (2 * 576 * 576 + 2 * 576 * 192
                                                                            + 3 * 576 * 1536) / (576 * 1536))
    # the demo's trainer forwards each group's prompt once: 8 responses of 40 after a 128-token prompt, and the
    # LM head reads the response tokens only
    assert weights["lm_head"] * shapes["lm_head"][0] == pytest.approx(8 * 40 / (128 + 8 * 40))
    padded = demo("trainer.shared_prompt=false")
    padded_weights = auto.step_weights(padded, arch, auto.probe_shapes(padded, arch))
    assert padded_weights["lm_head"] * shapes["lm_head"][0] == pytest.approx(40 / (128 + 40))
    times = {"trainer": {"fp32": 0.0051, "bf16": 0.0018}, "lm_head": {"fp32": 0.0314, "bf16": 0.0373},
             "decode": {"fp32": 1.0, "bf16": 1.0}, "decode_head": {"fp32": 1.0, "bf16": 1.0}}
    by_key = {c.key: c for c in auto.decide_precision(cfg, "cpu", times, weights)}
    assert by_key["trainer.precision"].value == "bf16" and by_key["trainer.precision"].ratio > 1.5
    assert auto.decide_precision(cfg, "cpu", times, dict.fromkeys(times, 1.0))[0].value == "fp32"


def test_the_shapes_are_the_runs() -> None:
    shapes = auto.probe_shapes(demo(), SMOLLM2)
    # micro-batch 8 × (256 / 2 prompt + 64 response) rows, capped; the decode step: n 8 × 4 prompts
    assert shapes["trainer"] == (auto.MAX_ROWS, 576, 1536)
    assert shapes["lm_head"] == (auto.HEAD_ROWS, 576, 49152)
    assert shapes["decode"] == (32, 576, 1536) and shapes["decode_head"] == (32, 576, 49152)
    # the attention the trainer runs: a micro-batch's rows (a 4800-token budget: 28 rows of 256 / 2 + 40) as
    # 28 // 8 = 3 shared-prompt sequences of one 128-token prompt and 8 responses of 40; 9 query over 3
    # key-value heads of 64
    assert shapes["attention"] == (3, 128 + 8 * 40, 9, 3, 64, 8, 40)
    # padded rows where the prompt is not shared: the 28 rows of 168 positions, causal
    assert auto.probe_shapes(demo("trainer.shared_prompt=false"), SMOLLM2)["attention"] == (28, 168, 9, 3, 64, 0, 0)
    megatron = demo('trainer.backend="megatron"', "trainer.use_dynamic_bsz=false")
    assert auto.probe_shapes(megatron, SMOLLM2)["attention"] == (8, 168, 9, 3, 64, 0, 0)  # no shared forward there
    long = auto.probe_shapes(demo("data.max_prompt_length=4096"), SMOLLM2)["attention"]
    assert long[:2] == (1, 2048 + 8 * 40)  # rows lowered to fit ATTN_SCORES, at least one
    from engine.plan.prompt_sharing import group_pays

    assert not group_pays(8, 32768, 40, 40)  # a 33k-token group's dense mask would take more than 64 MiB
    assert not auto.shares_prompt(demo('data.image_key="images"'))  # image rows are forwarded padded


def test_eager_attention_is_chosen_only_where_it_is_measurably_faster() -> None:
    shape = (32, 168, 9, 3, 64, 0, 0)
    short = auto.choose_attention(sdpa_s=0.19, eager_s=0.07, shape=shape)
    assert (short.key, short.value) == ("trainer.attn_implementation", "eager")
    assert short.line() == ("trainer.attn_implementation auto: eager 2.71× sdpa here, fwd + bwd at 32 × 168 "
                            "positions (eager from 1.1×) → eager")
    shared = auto.choose_attention(0.069, 0.073, (3, 448, 9, 3, 64, 8, 40))
    assert shared.value == "sdpa" and "3 × 448 positions (shared prompts)" in shared.line()
    assert auto.choose_attention(0.15, 0.59, shape).value == "sdpa"  # long rows: eager's S² loses
    assert auto.choose_attention(1.05, 1.0, shape).value == "sdpa"  # a tie keeps the O(S)-memory kernel
    cfg = demo('trainer.attn_implementation="auto"')
    assert [c.value for c in auto.decide_attention(cfg, "cuda", None, shape)] == ["sdpa"]
    long = (1, 2088, 9, 3, 64, 0, 0)
    assert not auto.measures_attention(cfg, "cpu", long) and auto.measures_attention(cfg, "cpu", shape)
    assert [c.value for c in auto.decide_attention(cfg, "cpu", None, long)] == ["sdpa"]
    assert auto.decide_attention(demo('trainer.attn_implementation="sdpa"'), "cpu", None, shape) == []


def test_the_resolved_config_has_concrete_values_and_its_plan_gives_the_threads() -> None:
    cfg = demo()
    assert auto.has_auto(cfg) and plan_threads(cfg, 2) == (1, 1)  # "auto" plans as the automatic split
    choices = [auto.Choice("trainer.precision", "fp32", 0.6, ""), auto.Choice("rollout.dtype", "bf16", 2.0, ""),
               auto.Choice("resources.trainer.cpu_threads", 2, 1.9, ""),
               auto.Choice("trainer.attn_implementation", "eager", 2.7, "")]
    resolved = auto.apply(cfg, choices)
    assert not auto.has_auto(resolved)
    assert (resolved.trainer.precision, resolved.rollout.dtype) == ("fp32", "bf16")
    assert resolved.trainer.attn_implementation == "eager"
    assert plan_threads(resolved, 2) == (2, 1)
    assert auto.mismatch_uncorrected(resolved)  # fp32 trainer, bf16 sampler, no correction in the demo


def plan_threads(cfg: RunConfig, cores: int) -> tuple[int, int]:
    actors = resolve_plan(cfg, cores=cores, base_dir=DEMO.parent).actors
    return actors["trainer_threads"], actors["replica_threads"]


def test_cpuinfo_gives_the_model_and_the_bf16_flags() -> None:
    text = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C\n"
            "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\nprocessor\t: 1\nmodel name\t: other\n")
    assert parse_cpuinfo(text) == {"cpu": "Intel(R) Xeon(R) Platinum 8375C",
                                   "isa": ["amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2"]}


def write_cache(cache: Path, cfg: RunConfig, model_dir: Path, bf16_speed: float, scaling: float) -> None:
    """A cache file that says bf16 runs `bf16_speed`× fp32 (on one thread, where the ratios are timed), every core
    `scaling`× one thread, and eager attention 2× sdpa."""
    import torch

    from engine.plan.machine import cpu_identity

    shapes = auto.probe_shapes(cfg, json.loads((model_dir / "config.json").read_text()))
    identity = cpu_identity()
    cores = identity["cores"]
    entries = {}
    for mode in ("fp32", "bf16"):  # attention: eager 2× sdpa in either precision, on one thread or all
        for threads in {1, cores}:
            entries[f"attention:sdpa-{mode}:{threads}"], entries[f"attention:eager-{mode}:{threads}"] = 1.0, 0.5
    for s in shapes:
        entries[f"{s}:fp32:1"] = 1.0
        entries[f"{s}:bf16:1"] = 1.0 / bf16_speed
        for mode in ("fp32", "bf16"):
            entries[f"{s}:{mode}:{cores}"] = entries[f"{s}:{mode}:1"] / scaling
    path = cache / "machine" / f"{auto.cache_key(identity, shapes, torch.__version__)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"entries": entries}))


@pytest.mark.parametrize(("bf16_speed", "precision", "threads"), [(0.6, "fp32", "split"), (1.8, "bf16", "all")])
def test_launch_resolves_auto_from_the_machines_measurement(tmp_path: Path, bf16_speed: float, precision: str,
                                                            threads: str) -> None:
    from engine.models.loader import resolve_model_path
    from engine.launch.probe import resolve_auto

    cfg = demo('model.path="builtin:tiny-qwen-all"')
    model_dir = resolve_model_path(cfg.model.path, tmp_path / "models")
    plan = resolve_plan(cfg, base_dir=DEMO.parent)
    write_cache(tmp_path / "cache", cfg, model_dir, bf16_speed, scaling=1.0 if threads == "split" else 2.0)
    out = io.StringIO()
    resolved, record = resolve_auto(plan, str(model_dir), cache_dir=tmp_path / "cache", out=out)
    lines = out.getvalue().splitlines()
    assert "cached" in lines[0]
    assert f"asyncrl: trainer.precision auto: bf16 {bf16_speed:.2f}× fp32 here (bf16 from 1.1×) → {precision}" in lines
    assert resolved.config.trainer.precision == resolved.config.rollout.dtype == precision
    cores = record["machine"]["cores"]
    want = cores if threads == "all" else plan.actors["trainer_threads"]
    assert resolved.actors["trainer_threads"] == resolved.config.resources.trainer.cpu_threads == want
    assert {c["key"]: c["value"] for c in record["choices"]}["trainer.precision"] == precision
    assert record["cached"] and record["measured"]["precision"]["lm_head"]["bf16"] == pytest.approx(1 / bf16_speed)
    if cfg.trainer.attn_implementation == "auto":
        assert resolved.config.trainer.attn_implementation == "eager" and record["measured"]["attention"] == {
            "sdpa": 1.0, "eager": 0.5, "threads": want}  # timed on the threads the trainer runs


def test_the_measurement_times_real_matmuls_and_caches_them(tmp_path: Path) -> None:
    from engine.launch.probe import Timings

    shapes = {"trainer": (16, 32, 64), "decode": (4, 32, 64), "attention": (2, 16, 4, 2, 32, 0, 0)}
    path = tmp_path / "m.json"
    timings = Timings(shapes, path)
    modes = {"trainer": ("fp32", "bf16"), "decode": ("fp32", "bf16"), "attention": ("sdpa-bf16", "eager-fp32")}
    first = {(s, m): timings.get(s, m, 1) for s in shapes for m in modes[s]}
    assert all(0 < t < 1 for t in first.values()) and not timings.cached
    timings.save({"shapes": shapes})
    again = Timings(shapes, path)
    assert again.cached and {(s, m): again.get(s, m, 1) for s in shapes for m in modes[s]} == first


def test_the_probe_times_the_shared_prompt_sequence_the_trainer_forwards() -> None:
    """The attention the launch times for a shared-prompt run has the mask the trainer's packing builds for a
    group (a 5-token prompt, 3 responses of 4), and runs in both kernels."""
    import torch

    from engine.launch import probe
    from engine.trainer.shared_prefix import pack

    prompt, n, r = [11, 12, 13, 14, 15], 3, 4
    ids = torch.tensor([prompt + [20 + 4 * i + j for j in range(r)] for i in range(n)])
    packed = pack(ids, torch.ones_like(ids), r)
    seen = {}
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):  # noqa: ANN001, ANN003, ANN202 — records what the probe passes
        seen["mask"] = attn_mask
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    shape = (1, len(prompt) + n * r, 4, 2, 32, n, r)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        assert probe.time_attention(shape, "sdpa", "bf16", 1) > 0
    assert seen["mask"].shape == (1, 1, *packed.mask.shape[-2:]) and torch.equal(seen["mask"][0], packed.mask[0])
    assert probe.time_attention(shape, "eager", "fp32", 1) > 0


def test_a_process_spinning_beside_the_measurement_counts_as_busy() -> None:
    from engine.launch.probe import CoresElsewhere

    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat")
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)
        with CoresElsewhere() as other:
            end = time.monotonic() + 1.0
            while time.monotonic() < end:  # this process works too; only the other one is "elsewhere"
                pass
    finally:
        spin.wait()
    assert other.cores >= 0.5


@pytest.mark.parametrize(("elsewhere", "kept"), [(1.0, False), (0.7, False), (0.2, True), (0.0, True)])
def test_a_measurement_taken_on_a_busy_machine_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             elsewhere: float, kept: bool) -> None:
    """A core busy elsewhere while the timings ran (here: the machine's busy CPU time grows by `elsewhere` cores
    beyond this process's own) keeps them out of the cache, so the next launch measures again."""
    import engine.launch.probe as probe
    from engine.models.loader import resolve_model_path

    cfg = demo('model.path="builtin:tiny-qwen-all"')
    model_dir = resolve_model_path(cfg.model.path, tmp_path / "models")
    clock = {"wall": time.monotonic(), "own": time.process_time()}

    def busy() -> float:  # the one input forced here: this process's CPU time plus `elsewhere` cores
        return time.process_time() - clock["own"] + elsewhere * (time.monotonic() - clock["wall"])

    monkeypatch.setattr(probe, "_busy_cpu_seconds", busy)
    out = io.StringIO()
    resolved, record = probe.resolve_auto(resolve_plan(cfg, base_dir=DEMO.parent), str(model_dir),
                                          cache_dir=tmp_path / "cache", out=out)
    assert not record["cached"] and not auto.has_auto(resolved.config)
    assert list((tmp_path / "cache").glob("machine/*.json")) != [] if kept else not (tmp_path / "cache").exists()
    assert ("not cached: the machine was busy" in out.getvalue()) is not kept
    assert record["cores_elsewhere"] == pytest.approx(elsewhere, abs=0.15)
    # thread scaling timed beside a busy core is not trusted: the trainer keeps the split's threads
    plan = resolve_plan(cfg, base_dir=DEMO.parent)
    line = next(x for x in out.getvalue().splitlines() if "resources.trainer.cpu_threads" in x)
    if kept:
        assert "not measured" not in line
    else:
        assert "not measured: other processes used" in line
        assert resolved.config.resources.trainer.cpu_threads == plan.actors["trainer_threads"]
