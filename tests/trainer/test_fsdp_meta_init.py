"""FSDP2 start-up from a meta skeleton (2 gloo ranks, built as the runtime builds the trainer): rank 0 alone
loads the weights; every rank ends with exactly the shards, buffers and tied weights of the load-everywhere
path, and the full weights it exports are the same."""

from __future__ import annotations

import pytest
import torch
from fsdp_meta_worker import run_rank
from trainer_helpers import spawn_ranks


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_only_rank_0_loads_and_every_rank_gets_the_same_shards(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, 2, tmp_path)
    assert ranks[0]["loads"] == ["load"] and ranks[1]["loads"] == []  # rank 1 never read the weights
    for r in ranks:
        assert r["same_params"] and r["same_buffers"] and r["tied"] and not r["any_meta"]
    exported, plain = ranks[0]["export"], ranks[0]["export_plain"]
    assert exported.keys() == plain.keys() and all(torch.equal(exported[n], plain[n]) for n in plain)
