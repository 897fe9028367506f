"""The Megatron performance settings resolved per device (`engine.plan.megatron_perf`): `launch --dry-run` prints
what the seed-000 preset runs with on CUDA and on CPU, `validate` refuses what a device cannot run, and the
memory model moves the optimizer state to the host with `trainer.optimizer_offload`."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl_cli.config.loader import analyze_run_config
from engine.plan.megatron_perf import perf_values, update_efficiency

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
SEED_000 = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"
MINI_CPU = RUNS / "seed000-mini-cpu.toml"


def test_dry_run_prints_the_cuda_settings_and_the_cpu_fallback(cli) -> None:
    r = cli("launch", SEED_000, "--dry-run")
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    cuda = out.split("megatron settings on cuda")[1].split("megatron settings on cpu")[0]
    cpu = out.split("megatron settings on cpu")[1].split("placement")[0]
    for words in ("moe_token_dispatcher_type = alltoall", "use_distributed_optimizer = True",
                  "overlap_grad_reduce = True", "transformer_impl = local"):
        assert words in cuda, words
    for words in ("moe_token_dispatcher_type = allgather", "use_distributed_optimizer = False",
                  "overlap_grad_reduce = False"):
        assert words in cpu, words
    doc = json.loads(cli("launch", SEED_000, "--dry-run", "--json").stdout)
    by_key = {d: {s["key"]: s["value"] for s in v} for d, v in doc["megatron_settings"].items()}
    assert by_key["cuda"]["overlap_grad_reduce"] is True and by_key["cpu"]["overlap_grad_reduce"] is False


def test_a_cpu_preset_prints_only_its_own_settings(cli) -> None:
    doc = json.loads(cli("launch", MINI_CPU, "--dry-run", "--json").stdout)
    assert list(doc["megatron_settings"]) == ["cpu"]


def test_validate_refuses_what_the_device_cannot_run() -> None:
    an = analyze_run_config(MINI_CPU, ['trainer.moe_token_dispatcher_type="alltoall"',
                                       "trainer.use_distributed_optimizer=true"])
    codes = {p.code for p in an.problems if p.severity == "error"}
    assert {"megatron-alltoall-cpu", "megatron-distopt-device"} <= codes
    assert analyze_run_config(SEED_000, ["trainer.overlap_grad_reduce=false"]).exit_code == 0


def test_optimizer_offload_moves_the_optimizer_state_to_the_host() -> None:
    base = analyze_run_config(SEED_000)
    off = analyze_run_config(SEED_000, ["trainer.optimizer_offload=true"])
    assert off.exit_code == 0
    assert "optimizer" in base.fit.trainer.components_gb and "optimizer" not in off.fit.trainer.components_gb
    assert off.fit.trainer.host_gb["optimizer"] == base.fit.trainer.components_gb["optimizer"]
    assert off.fit.trainer.total_gb < base.fit.trainer.total_gb


def test_the_update_efficiency_counts_each_slow_setting_once() -> None:
    cfg = analyze_run_config(SEED_000).config
    cuda, cpu = perf_values(cfg, "cuda"), perf_values(cfg, "cpu")
    fast = {"transformer_impl": "transformer_engine", "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall",
            "overlap_grad_reduce": True, "rows": "packed (thd)"}
    assert update_efficiency(fast, is_moe=True, ep=8, dp=8) == 1.0
    # local spec, SequentialMLP and padded rows on CUDA: 0.85 · 0.6 · 0.8
    assert abs(update_efficiency(cuda, is_moe=True, ep=8, dp=8) - 0.408) < 1e-9
    assert update_efficiency(cpu, is_moe=True, ep=8, dp=8) < update_efficiency(cuda, is_moe=True, ep=8, dp=8)
    assert update_efficiency(cuda, is_moe=False, ep=1, dp=1) == update_efficiency(cpu, is_moe=False, ep=1, dp=1)
