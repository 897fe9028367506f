"""Pipeline parallelism over two gloo processes (PP 2 × TP 1 × DP 1): Megatron's 1F1B schedule gives the
same log-probs, gradient norm and updates as PP = 1, the last stage's log-probs reach the first stage, the
export gathers the full HF checkpoint across the stages, and checkpoints round-trip. qwen2 has tied
embeddings (the last stage keeps a copy whose gradient Megatron all-reduces), qwen3_moe a routed-expert
stage and a dense stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_helpers import as_tensor, assert_exports_checkpoint, hf_grad_norm, hf_log_probs, make_batch, nll_loss, spawn, tiny_hf_model
from megatron_workers import TEMPERATURE, pipeline_parallel_rank

pytestmark = [pytest.mark.megatron, pytest.mark.integration, pytest.mark.timeout(300)]
KINDS = ("qwen2", "qwen3_moe")


@pytest.fixture(scope="module")
def pp2(hf_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    ckpt = tmp_path_factory.mktemp("pp2-ckpt")
    return spawn(pipeline_parallel_rank, 2, {k: str(hf_dirs[k]) for k in KINDS}, str(ckpt), timeout=280)


@pytest.fixture(scope="module")
def pp1(hf_dirs: dict[str, Path], process_group: None) -> dict[str, dict]:
    """The same schedule of calls on one rank (PP = 1)."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    out = {}
    for kind in KINDS:
        backend = MegatronTrainerBackend(str(hf_dirs[kind]), optim_cfg={"lr": 1e-2}, micro_batch_size=2,
                                         temperature=TEMPERATURE, grad_clip=1e9)
        batch = make_batch()
        lp, ent = backend.compute_log_probs(batch, with_entropy=True)
        metrics = [backend.train_step(batch, nll_loss) for _ in range(2)]
        out[kind] = {"log_probs": lp, "entropy": ent, "losses": [m["actor/loss"] for m in metrics],
                     "grad_norms": [m["actor/grad_norm"] for m in metrics],
                     "after_lp": backend.compute_log_probs(batch)[0], "after_export": backend.hf_state_dict()}
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_pp2_log_probs_reach_every_stage_and_equal_pp1(pp2: list[dict], pp1: dict, kind: str) -> None:
    first, last = pp2[0][kind], pp2[1][kind]
    assert torch.equal(as_tensor(first["log_probs"]), as_tensor(last["log_probs"]))
    assert torch.equal(as_tensor(first["entropy"]), as_tensor(last["entropy"]))
    torch.testing.assert_close(as_tensor(last["log_probs"]), pp1[kind]["log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(as_tensor(last["entropy"]), pp1[kind]["entropy"], atol=1e-5, rtol=0)
    ref, _ = hf_log_probs(tiny_hf_model(kind), make_batch(), TEMPERATURE)
    torch.testing.assert_close(as_tensor(first["log_probs"]), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_pp2_training_follows_pp1(pp2: list[dict], pp1: dict, kind: str) -> None:
    first, last = pp2[0][kind], pp2[1][kind]
    assert first["losses"] == last["losses"] and first["grad_norms"] == last["grad_norms"]
    assert first["grad_norms"][0] == pytest.approx(hf_grad_norm(tiny_hf_model(kind), make_batch(), TEMPERATURE),
                                                   rel=1e-5)
    assert first["losses"] == pytest.approx(pp1[kind]["losses"], rel=1e-5)
    assert first["grad_norms"] == pytest.approx(pp1[kind]["grad_norms"], rel=1e-4)
    assert first["losses"][1] < first["losses"][0]
    # after two updates (and the checkpoint round trip) the weights still match PP = 1
    torch.testing.assert_close(as_tensor(first["after_lp"]), pp1[kind]["after_lp"], atol=1e-4, rtol=0)
    for name, tensor in pp1[kind]["after_export"].items():
        torch.testing.assert_close(as_tensor(first["after_export"][name]), tensor, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_pp2_export_gathers_the_checkpoint_across_stages(pp2: list[dict], hf_dirs: dict[str, Path],
                                                         kind: str) -> None:
    for rank in pp2:
        assert_exports_checkpoint(rank[kind]["export"], hf_dirs[kind], frozenset({"lm_head.weight"}))


@pytest.mark.parametrize("kind", KINDS)
def test_pp2_proximal_swap_and_checkpoint_round_trip(pp2: list[dict], kind: str) -> None:
    for rank in pp2:
        r = rank[kind]
        assert r["restored"] and r["reloaded_equal"] and r["reloaded_prox_equal"]
        assert torch.equal(as_tensor(r["prox"]), as_tensor(r["log_probs"]))
        assert r["snapshot_bytes"] == r["param_bytes"]


@pytest.mark.slow
def test_pp2_with_expert_parallelism_trains_like_one_rank(hf_dirs: dict[str, Path], process_group: None) -> None:
    """PP 2 × EP 2 × DP 2 on qwen3-MoE (stage 0 holds the routed experts, stage 1 a dense layer): each DP
    replica's log-probs are its rows of the one-rank log-probs, and the updates follow the full batch."""
    from megatron_workers import pipeline_expert_rank

    from engine.trainer.megatron.backend import MegatronTrainerBackend

    ranks = spawn(pipeline_expert_rank, 4, str(hf_dirs["qwen3_moe"]), timeout=280)
    one = MegatronTrainerBackend(str(hf_dirs["qwen3_moe"]), optim_cfg={"lr": 1e-2}, micro_batch_size=1,
                                 temperature=TEMPERATURE, grad_clip=1e9)
    full = make_batch(rows=4)
    lp = one.compute_log_probs(full)[0]
    metrics = [one.train_step(full, nll_loss) for _ in range(2)]
    for r in ranks:
        rows = slice(2 * r["dp_rank"], 2 * r["dp_rank"] + 2)
        torch.testing.assert_close(as_tensor(r["log_probs"]), lp[rows], atol=1e-5, rtol=0)
        assert r["grad_norms"] == pytest.approx([m["actor/grad_norm"] for m in metrics], rel=1e-4)
        assert r["losses"] == pytest.approx([m["actor/loss"] for m in metrics], rel=1e-5)
        assert r["restored"] and torch.equal(as_tensor(r["prox"]), as_tensor(r["log_probs"]))
    assert sorted(r["dp_rank"] for r in ranks) == [0, 0, 1, 1]
