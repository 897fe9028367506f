"""The FSDP2 weight export for a sync (seed 002's path, on 2 gloo ranks): tensor by tensor, gathered on the
device in the export dtype (the replicas' — bf16 here over fp32 master shards), no full state dict built, the
bytes those of the export dtype, the values the full fp32 parameters cast."""

from __future__ import annotations

import pytest
import torch
from fsdp_export_worker import run_rank
from trainer_helpers import build_tiny_lm, spawn_ranks

from engine.trainer.torch_trainer import TorchTrainerBackend


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_fsdp2_exports_bf16_gathered_per_tensor_without_a_full_state_dict(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, 2, tmp_path)
    main, other = ranks
    assert main["calls"] == [] and other["calls"] == []  # the export built no full state dict on any rank
    assert other["export"] == {} and main["buckets"] > 1
    exported, reference = main["export"], main["reference"]
    assert set(exported) == set(reference) and "lm_head.weight" in exported  # tied alias included
    params = sum(t.numel() for t in reference.values())
    assert sum(t.numel() * t.element_size() for t in exported.values()) == 2 * params  # bf16 bytes
    for name, t in exported.items():
        assert reference[name].dtype == torch.float32 and t.dtype == torch.bfloat16, name
        assert torch.equal(t, reference[name].to(torch.bfloat16)), name


def test_one_process_exports_in_the_export_dtype() -> None:
    trainer = TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg={"lr": 1e-3}, export_dtype="bfloat16")
    exported = {n: t for b in trainer.export_weights(1 << 12) for n, t in b.items()}
    state = trainer.model.state_dict()
    assert set(exported) == set(state)
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, state[n].to(torch.bfloat16)) for n, t in exported.items())
    plain = TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg={"lr": 1e-3})
    live = {n: t for b in plain.export_weights(1 << 12) for n, t in b.items()}
    assert all(t.data_ptr() == plain.model.state_dict()[n].data_ptr() for n, t in live.items())  # no copy
