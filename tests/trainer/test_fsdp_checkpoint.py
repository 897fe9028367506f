"""FSDP2 checkpoints are sharded (2 gloo ranks): each rank writes its own shards (torch distributed checkpoint),
nothing is gathered to a full state dict, the barriers run on a gloo group whose timeout covers a save, and a
resume continues bit for bit (weights, AdamW state, step, lr, RNG, and the version's weights of a checkpoint taken
between two syncs, `version_dcp/`)."""

from __future__ import annotations

import json

import pytest
from fsdp_ckpt_worker import run_rank
from trainer_helpers import spawn_ranks

from engine.trainer.process_groups import CHECKPOINT_TIMEOUT_S, PROCESS_GROUP_TIMEOUT_S


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_rank_sharded_checkpoint_resumes_bit_for_bit(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, 2, tmp_path)
    for r in ranks:
        assert r["gathered"] == []  # no full state dict on any rank
        assert r["restored_rng"] and r["step"] == 3 and r["same_metrics"] and r["same_params"]
        assert r["same_version"]  # the version's weights (the snapshot of the last sync), each rank's shards
        assert r["group_backend"] == "gloo" and r["group_timeout_s"] == CHECKPOINT_TIMEOUT_S > PROCESS_GROUP_TIMEOUT_S
    ckpt = tmp_path / "ckpt"
    shards = sorted(p.name for p in (ckpt / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard
    assert sorted(p.name for p in (ckpt / "version_dcp").iterdir()) == shards
    assert not (ckpt / "model.safetensors").exists() and not (ckpt / "optimizer.pt").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["format"] == "dcp"
    assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
