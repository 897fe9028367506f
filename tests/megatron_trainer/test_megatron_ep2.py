"""Expert parallelism over two gloo processes (Qwen3-MoE, EP = DP = 2): experts split across ranks, the
proximal snapshot covering the expert-parallel DDP buffer, and a decoupled-mode checkpoint round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from megatron_helpers import as_tensor, hf_grad_norm, hf_log_probs, make_batch, spawn, tiny_hf_model
from megatron_workers import TEMPERATURE, expert_parallel_rank

pytestmark = [pytest.mark.megatron, pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def ep2(hf_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    ckpt = tmp_path_factory.mktemp("ep2") / "ckpt"
    return spawn(expert_parallel_rank, 2, str(hf_dirs["qwen3_moe"]), str(ckpt), timeout=200)


def test_ep2_log_probs_over_data_parallel_shards_match_transformers(ep2: list[dict]) -> None:
    batch = make_batch(rows=4)
    ref, ref_ent = hf_log_probs(tiny_hf_model("qwen3_moe"), batch, TEMPERATURE)
    log_probs = torch.cat([as_tensor(r["log_probs"]) for r in ep2])
    entropy = torch.cat([as_tensor(r["entropy"]) for r in ep2])
    torch.testing.assert_close(log_probs, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_ent, atol=1e-5, rtol=0)


def test_ep2_update_uses_the_global_batch_gradient(ep2: list[dict]) -> None:
    reference = hf_grad_norm(tiny_hf_model("qwen3_moe"), make_batch(rows=4), TEMPERATURE)
    assert ep2[0]["grad_norms"][0] == pytest.approx(reference, rel=1e-5)
    assert ep2[0]["grad_norms"] == ep2[1]["grad_norms"] and ep2[0]["losses"] == ep2[1]["losses"]
    assert ep2[0]["losses"][1] < ep2[0]["losses"][0]


def test_ep2_export_collects_every_expert(ep2: list[dict], hf_dirs: dict[str, Path]) -> None:
    from engine.trainer.megatron.convert import SafetensorsSource

    source = SafetensorsSource(hf_dirs["qwen3_moe"])
    for rank in ep2:
        assert set(rank["export"]) == set(source.keys())
        for name in source:
            assert np.array_equal(rank["export"][name], source(name).numpy()), name


def test_ep2_sync_export_gathers_the_experts_to_the_sender_only(ep2: list[dict]) -> None:
    """The weight sync's export: rank 0 (the sender) gets every tensor, in the model's dtype, equal to the
    all-gathered export; rank 1 sends its experts and receives nothing (it used to receive rank 0's)."""
    sender, other = ep2
    assert set(sender["sync_export"]) == set(sender["export"]) and other["sync_export"] == {}
    for name, t in sender["sync_export"].items():
        assert torch.equal(as_tensor(t), as_tensor(sender["export"][name])), name
    assert other["gathered"]["all_gather"] > 0 and other["gathered"]["to_sender"] == 0
    assert sender["gathered"]["to_sender"] == sender["gathered"]["all_gather"]
    print(f"EP 2 x DP 2 export, bytes received per rank: all-gather {[r['gathered']['all_gather'] for r in ep2]}, "
          f"to the sender {[r['gathered']['to_sender'] for r in ep2]}")


def test_ep2_snapshot_includes_the_expert_parallel_buffer(ep2: list[dict]) -> None:
    for rank in ep2:
        assert rank["expert_buffers"] == 1
        assert rank["snapshot_bytes"] == rank["param_bytes"]
        assert rank["restored"]
        assert torch.equal(as_tensor(rank["prox"]), as_tensor(rank["log_probs"]))


def test_ep2_checkpoint_in_decoupled_mode_reloads_identically(ep2: list[dict]) -> None:
    for rank in ep2:
        assert rank["reloaded_equal"] and rank["reloaded_prox_equal"]
