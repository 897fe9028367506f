"""Ulysses sequence parallelism (`engine.trainer.ulysses`) on CPU with gloo: SP = 2 over 2 real ranks gives the
one-process trainer's log-probs, entropy and gradients (fp32), on text models (sdpa with its 1 KV head repeated,
eager with 2 KV heads split, a chunked head and gradient checkpointing) and on multimodal rows of the tiny Qwen3-VL (image, M-RoPE,
deepstack), and the same loss, gradient norm and weights after a train step."""

from __future__ import annotations

import json

import pytest
from trainer_helpers import spawn_ranks

from engine.plan.sequence_parallel import ulysses_problem as check_sp


def test_divisibility_rule_names_the_numbers() -> None:
    assert check_sp(2, 4, 28, 4) is None and check_sp(8, 8, 32, 4) is None  # 4 KV heads repeated for s = 8
    assert "divide the trainer's 6 ranks" in check_sp(4, 6, 32, 8)
    assert "28 attention heads" in check_sp(8, 8, 28, 4)
    assert "3 KV heads" in check_sp(2, 2, 6, 3)


@pytest.mark.slow
def test_sp2_matches_one_process(tmp_path) -> None:
    from engine.models.tiny_vl import build_tiny_vl_model_dir

    vl_dir = build_tiny_vl_model_dir(tmp_path / "vl", seed=0)
    (tmp_path / "args.json").write_text(json.dumps({"vl_dir": str(vl_dir)}))
    ranks = spawn_ranks(__import__("ulysses_worker").run_rank, 2, tmp_path)
    for results in ranks:
        for r in results:
            assert r["dp_rank"] == 0, r["name"]  # one SP group: both ranks hold the same rows
            assert r["log_prob_diff"] <= 1e-5, r["name"]
            assert r["entropy_diff"] <= 1e-5, r["name"]
            assert r["compute_log_prob_diff"] <= 1e-5, r["name"]
            worst = max(r["grad_rel_diff"].values())
            assert worst <= 1e-4, (r["name"], sorted(r["grad_rel_diff"].items(), key=lambda kv: -kv[1])[:3])
            assert all(n > 0 for n in r["grad_norm"].values()), r["name"]
            assert r["loss"][0] == pytest.approx(r["loss"][1], rel=1e-5, abs=1e-6), r["name"]
            assert r["grad_norm_metric"][0] == pytest.approx(r["grad_norm_metric"][1], rel=1e-4), r["name"]
    assert all(r["weight_diff"] <= 1e-5 for r in ranks[0]), [(r["name"], r["weight_diff"]) for r in ranks[0]]
