"""The shared-prompt forward under FSDP2 over gloo with 2 processes — the production trainer's code path (sharded
parameters, the model's own forward with its FSDP hooks, bf16 compute over fp32 shards): each rank packs its own
groups, and the log-probs, losses, gradient norms and weights after two updates equal the padded forward's."""

from __future__ import annotations

import pytest
import torch
from fsdp_shared_worker import run_rank
from trainer_helpers import spawn_ranks

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_ranks(run_rank, WORLD, tmp_path_factory.mktemp("fsdp-shared"))


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_fp32_shared_prompt_equals_the_padded_rows_on_two_ranks(ranks: list[dict]) -> None:
    for r in ranks:
        shared, padded = r["fp32/shared"], r["fp32/padded"]
        torch.testing.assert_close(shared["log_probs"], padded["log_probs"], atol=2e-5, rtol=1e-5)
        for a, b in zip(padded["metrics"], shared["metrics"]):
            assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5, abs=1e-7)
            assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
            assert a["asyncrl/trainer/shared_prompt_saving"] == 1.0
            assert b["asyncrl/trainer/shared_prompt_saving"] > 1.3  # the shared forward ran on this rank
    weights = ranks[0]["fp32/padded"]["weights"]
    assert weights
    for name, value in weights.items():
        torch.testing.assert_close(ranks[0]["fp32/shared"]["weights"][name], value, atol=1e-6, rtol=1e-5)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bf16_compute_shares_the_prompt_within_bf16_rounding(ranks: list[dict]) -> None:
    for r in ranks:
        shared, padded = r["bf16/shared"], r["bf16/padded"]
        assert shared["metrics"][0]["asyncrl/trainer/shared_prompt_saving"] > 1.3
        assert 0.0 < float((shared["log_probs"] - padded["log_probs"]).abs().max()) < 0.1  # bf16 matmuls, same π
        assert shared["metrics"][0]["actor/grad_norm"] == pytest.approx(padded["metrics"][0]["actor/grad_norm"],
                                                                        rel=0.05)
