"""`asyncrl init` on the frontier MoE models (issue 45): DeepSeek-V3, Kimi-K2, Qwen3-Coder-480B and
Qwen3-235B-A22B on ≤ 256 H100s. Each family's split: rollout replicas across nodes (data × expert parallel), fp8
rollout weights where bf16 replicas leave the trainer too few GPUs, the Megatron optimizer state in host memory
where no layout fits 80 GB without it; the written preset validates, and the shipped presets are what init
writes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.config.released_configs import RELEASED

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"

CASES = {  # hub id → (GPUs, published total, published active, shipped preset)
    "deepseek-ai/DeepSeek-V3": (256, 671e9, 37e9, "deepseek-v3-gsm8k-megatron-256.toml"),
    "moonshotai/Kimi-K2-Instruct": (256, 1.0e12, 32e9, "kimi-k2-gsm8k-megatron-256.toml"),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (128, 480e9, 35e9, "qwen3-coder-480b-gsm8k-megatron-128.toml"),
    "Qwen/Qwen3-235B-A22B": (128, 235e9, 22e9, "qwen3-235b-a22b-gsm8k-megatron-128.toml"),
}


def _init(cli, tmp_path: Path, name: str) -> tuple[dict, dict]:
    gpus = CASES[name][0]
    model = tmp_path / name.split("/")[1]
    model.mkdir()
    (model / "config.json").write_text(json.dumps(RELEASED[name][0]))
    r = cli("init", "--model", model, "--dataset", "gsm8k", "--hardware", "h100", "--gpus", gpus, "-o", "run.toml")
    assert r.exit_code == 0, r.output
    v = cli("validate", "run.toml", "--json")
    assert v.exit_code == 0, v.output
    return tomllib.loads((tmp_path / "run.toml").read_text()), json.loads(v.stdout)


def _gpus(r: dict) -> int:
    return r["tensor_parallel_size"] * r.get("pipeline_model_parallel_size", 1) * r.get("data_parallel_size", 1)


def _deepseek_v3(run: dict, doc: dict) -> None:
    """bf16 replicas of 8 nodes (EP 64); the Megatron optimizer state in host memory."""
    r = run["rollout"]
    assert "quantization" not in r and (r["data_parallel_size"], r["expert_parallel_size"]) == (8, 64)
    # 17.2B dense parameters over TP 8 and 653.9B of experts over EP 64, bf16: ~24.7 GB per GPU
    assert doc["memory"]["rollout"]["components_gb"]["weights"] == pytest.approx(24.7, abs=0.2)
    assert run["trainer"]["optimizer_offload"] and "optimizer" in doc["memory"]["trainer"]["host_gb"]


def _kimi_k2(run: dict, doc: dict) -> None:
    """fp8 replicas (a bf16 one would leave the trainer too few GPUs), with token-level IS in the loss."""
    assert run["rollout"]["quantization"] == "fp8"
    rc = run["algorithm"]["rollout_correction"]
    assert rc["rollout_is"] == "token" and rc["bypass_mode"] is False
    assert doc["memory"]["rollout"]["details"]["quantization"] == "fp8"
    assert not [p for p in doc["problems"] if p["code"].startswith("rollout-fp8")]


def _qwen3_coder(run: dict, doc: dict) -> None:
    """fp8 replicas of 4 nodes, EP dividing the 160 experts."""
    r = run["rollout"]
    assert r["quantization"] == "fp8" and _gpus(r) == 32 and 160 % r["expert_parallel_size"] == 0


def _qwen3_235b(run: dict, doc: dict) -> None:
    """bf16 replicas of 4 nodes; pipeline stages that divide the 94 layers."""
    r = run["rollout"]
    assert "quantization" not in r and _gpus(r) == 32 and 94 % run["trainer"]["pp"] == 0


FAMILY = {"deepseek-ai/DeepSeek-V3": _deepseek_v3, "moonshotai/Kimi-K2-Instruct": _kimi_k2,
          "Qwen/Qwen3-Coder-480B-A35B-Instruct": _qwen3_coder, "Qwen/Qwen3-235B-A22B": _qwen3_235b}


@pytest.mark.parametrize("name", sorted(CASES))
def test_init_splits_the_model_and_writes_the_shipped_preset(cli, tmp_path: Path, name: str) -> None:
    gpus, total, active, preset = CASES[name]
    run, doc = _init(cli, tmp_path, name)
    res = run["resources"]
    assert sum(res[k]["nnodes"] * res[k]["gpus_per_node"] for k in ("trainer", "rollout")) <= gpus
    assert doc["model"]["params_total"] == pytest.approx(total, rel=0.03)
    assert doc["model"]["params_active"] == pytest.approx(active, rel=0.03)
    assert doc["memory"]["trainer"]["fits"] and doc["memory"]["rollout"]["fits"]
    r = run["rollout"]
    # every one of these replicas is larger than a node: TP = a node, data × expert parallel across nodes
    assert r["tensor_parallel_size"] == 8 and r["expert_parallel_size"] == 8 * r["data_parallel_size"] > 8
    assert _gpus(r) % 8 == 0 and res["rollout"]["nnodes"] * 8 % _gpus(r) == 0
    assert doc["memory"]["rollout"]["details"]["replica_gpus"] == _gpus(r)
    assert run["trainer"]["backend"] == "megatron"
    FAMILY[name](run, doc)
    shipped = tomllib.loads((RUNS / preset).read_text())
    for table in ("resources", "trainer", "rollout", "algorithm"):
        assert shipped.get(table) == run.get(table), table
    v = cli("validate", RUNS / preset, "--json")
    assert v.exit_code == 0 and json.loads(v.stdout)["model"]["source"].startswith("known:")
