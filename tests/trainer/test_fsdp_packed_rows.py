"""Packed rows under FSDP2 over gloo with 2 processes — the production trainer's code path (sharded parameters,
the model's own forward with its FSDP hooks, token budgets whose micro-batch count the ranks agree on): a frozen
reference's log-probs, the losses, gradient norms and weights after two updates equal the padded trainer's."""

from __future__ import annotations

import pytest
import torch
from fsdp_packed_worker import run_rank
from trainer_helpers import spawn_ranks

WORLD = 2


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_fp32_packed_rows_equal_the_padded_rows_on_two_ranks(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, WORLD, tmp_path)
    for r in ranks:
        packed, padded = r["packed"], r["padded"]
        assert (packed["ref_log_probs"] - padded["ref_log_probs"]).abs().max() <= 1e-5
        for a, b in zip(padded["metrics"], packed["metrics"]):
            assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5, abs=1e-7)
            assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
            assert a["asyncrl/trainer/shared_prompt_saving"] == 1.0
            assert b["asyncrl/trainer/shared_prompt_saving"] > 1.0  # padding was removed on this rank
            assert b["asyncrl/trainer/micro_batches"] <= a["asyncrl/trainer/micro_batches"]
    weights = ranks[0]["padded"]["weights"]
    assert weights
    for name, value in weights.items():
        torch.testing.assert_close(ranks[0]["packed"]["weights"][name], value, atol=1e-6, rtol=1e-5)
