"""Tensor parallelism over two gloo processes (dense Qwen3 and Qwen3-MoE): the same numbers as TP = 1 and
as transformers, and the same guarantees for export and the proximal snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_helpers import as_tensor, assert_exports_checkpoint, hf_grad_norm, hf_log_probs, make_batch, spawn, tiny_hf_model
from megatron_workers import TEMPERATURE, tensor_parallel_rank

pytestmark = [pytest.mark.megatron, pytest.mark.integration, pytest.mark.timeout(240)]
KINDS = ("qwen3", "qwen3_moe")


@pytest.fixture(scope="module")
def tp2(hf_dirs: dict[str, Path]) -> list[dict]:
    return spawn(tensor_parallel_rank, 2, {k: str(hf_dirs[k]) for k in KINDS}, timeout=200)


@pytest.mark.parametrize("kind", KINDS)
def test_tp2_log_probs_equal_tp1_and_transformers(tp2: list[dict], hf_dirs: dict[str, Path], kind: str,
                                                  process_group: None) -> None:
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    batch = make_batch()
    r0, r1 = tp2[0][kind], tp2[1][kind]
    assert torch.equal(as_tensor(r0["log_probs"]), as_tensor(r1["log_probs"]))
    tp1 = MegatronTrainerBackend(str(hf_dirs[kind]), temperature=TEMPERATURE, micro_batch_size=2)
    lp1, ent1 = tp1.compute_log_probs(batch, with_entropy=True)
    torch.testing.assert_close(as_tensor(r0["log_probs"]), lp1, atol=1e-5, rtol=0)
    torch.testing.assert_close(as_tensor(r0["entropy"]), ent1, atol=1e-5, rtol=0)
    ref, _ = hf_log_probs(tiny_hf_model(kind), batch, TEMPERATURE)
    torch.testing.assert_close(as_tensor(r0["log_probs"]), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_tp2_forward_backward_trains_with_the_true_gradient_norm(tp2: list[dict], kind: str) -> None:
    r0, r1 = tp2[0][kind], tp2[1][kind]
    reference = hf_grad_norm(tiny_hf_model(kind), make_batch(), TEMPERATURE)
    assert r0["grad_norms"][0] == pytest.approx(reference, rel=1e-5)
    assert r0["grad_norms"] == r1["grad_norms"] and r0["losses"] == r1["losses"]
    assert r0["losses"][1] < r0["losses"][0]


@pytest.mark.parametrize("kind", KINDS)
def test_tp2_export_gathers_the_checkpoint_bit_exactly(tp2: list[dict], hf_dirs: dict[str, Path], kind: str) -> None:
    assert_exports_checkpoint(tp2[0][kind]["export"], hf_dirs[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_tp2_proximal_swap_is_bit_exact(tp2: list[dict], kind: str) -> None:
    for rank in tp2:
        r = rank[kind]
        assert r["restored"]
        assert torch.equal(as_tensor(r["prox"]), as_tensor(r["log_probs"]))
        assert r["snapshot_bytes"] == r["param_bytes"]
