"""Packed rows (`engine.trainer.packed_rows`, verl's `use_remove_padding`): the rows of a micro-batch forwarded
without padding give the padded forward's per-token log-probs (≤ 1e-5 in fp32) and gradients — for the policy
(`train_step`) and a frozen reference (`compute_log_probs`), on both layouts (first-fit sequences under a
block-diagonal mask; one sequence whose restarting positions transformers reads as packed) — and token budgets
then count the packed tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import build_tiny_lm, build_tiny_moe_lm, random_batch, token_mean_pg_loss

from engine.trainer.batch import plan_micro_batches, row_lengths
from engine.trainer.logprobs import response_log_probs
from engine.trainer.minibatch import micro_batch_count
from engine.trainer.packed_rows import (
    first_fit,
    layout,
    pack_rows,
    packed_cost,
    packed_micro_batch_count,
    packed_micro_batches,
)
from engine.trainer.shared_prefix import shared_prompt_log_probs
from engine.trainer.torch_trainer import TorchTrainerBackend

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}
BUILDERS = {"dense": build_tiny_lm, "moe": build_tiny_moe_lm}


def make(model: torch.nn.Module, **kw: object) -> TorchTrainerBackend:
    return TorchTrainerBackend(model, **({"optim_cfg": OPTIM, "grad_clip": 1e6, "micro_batch_size": 12,
                                         "shared_prompt": False} | kw))


@pytest.mark.parametrize("kind", ["masked", "varlen"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_log_probs_and_gradients_equal_the_padded_rows(kind: str, attn: str) -> None:
    """The same rows, packed and padded: per-token log-probs within 1e-5 and the same parameter gradients."""
    torch.use_deterministic_algorithms(False)
    model = build_tiny_lm()
    model.config._attn_implementation = attn
    batch = random_batch(rows=9, seed=3)
    r = batch.responses.shape[1]
    packed = pack_rows(batch.input_ids, batch.attention_mask, r, kind)  # type: ignore[arg-type]
    assert packed.tokens < batch.input_ids.numel()
    if kind == "varlen":
        assert packed.mask is None and packed.input_ids.shape[0] == 1
        assert packed.tokens == sum(row_lengths(batch))
    mask = batch.response_mask.bool()
    grads = []
    for use_packed in (False, True):
        model.zero_grad(set_to_none=True)
        if use_packed:
            lp, ent = shared_prompt_log_probs(model, packed, batch.responses, 1.0, with_entropy=True)
        else:
            lp, ent = response_log_probs(model, batch.input_ids, batch.attention_mask, batch.position_ids,
                                         batch.responses, 1.0, with_entropy=True)
        (-(lp * batch.advantages * batch.response_mask).sum() + (ent * batch.response_mask).sum()).backward()
        grads.append(([p.grad.clone() for p in model.parameters()], lp.detach(), ent.detach()))
    (g_pad, lp_pad, h_pad), (g_pack, lp_pack, h_pack) = grads
    assert (lp_pack[mask] - lp_pad[mask]).abs().max() <= 1e-5
    torch.testing.assert_close(h_pack[mask], h_pad[mask], atol=1e-5, rtol=1e-5)
    for a, b in zip(g_pack, g_pad):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_policy_updates_and_reference_log_probs_equal_the_padded_trainer(kind: str) -> None:
    """Two optimizer updates with packed rows end at the padded trainer's weights; a frozen reference with
    packed rows returns the padded reference's log-probs; the packed forward ran on fewer tokens."""
    model = BUILDERS[kind]()
    model.config._attn_implementation = "eager"
    padded = make(copy.deepcopy(model), use_remove_padding=False)
    packed = make(copy.deepcopy(model), use_remove_padding=True)
    assert packed.packing == "masked" and padded.packing is None
    for seed in (0, 1):
        batch = random_batch(rows=10, seed=seed)
        a, b = padded.train_step(batch, token_mean_pg_loss), packed.train_step(batch, token_mean_pg_loss)
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5, abs=1e-7)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
        assert a["asyncrl/trainer/shared_prompt_saving"] == 1.0
        assert b["asyncrl/trainer/shared_prompt_saving"] > 1.2  # padding was not forwarded
    for (name, p), q in zip(padded.model.named_parameters(), packed.model.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)
    ref_padded = make(copy.deepcopy(model), frozen=True, use_remove_padding=False)
    ref_packed = make(copy.deepcopy(model), frozen=True, use_remove_padding=True)
    batch = random_batch(rows=10, seed=5)
    want, _ = ref_padded.compute_log_probs(batch)
    got, _ = ref_packed.compute_log_probs(batch)
    assert (got - want).abs().max() <= 1e-5
    assert ref_packed.take_forward_saving() > 1.2


def test_each_row_attends_to_itself_only_at_its_own_positions() -> None:
    batch = random_batch(rows=6, seed=0, max_prompt=9, max_response=8)  # lengths 14, 9, 4, 16, 10, 7
    r = batch.responses.shape[1]
    lengths = row_lengths(batch)
    packed = pack_rows(batch.input_ids, batch.attention_mask, r, "masked")
    width = max(lengths)
    assert packed.input_ids.shape[1] == width and packed.input_ids.shape[0] < len(lengths)
    allowed = packed.mask[:, 0] == 0
    seen = 0
    for s, rows in enumerate(first_fit(lengths, width)):
        at = 0
        for i in rows:
            n = lengths[i]
            block = allowed[s, at:at + n]
            assert torch.equal(block[:, at:at + n], torch.ones(n, n, dtype=torch.bool).tril())
            assert not block[:, :at].any() and not block[:, at + n:].any()
            assert packed.position_ids[s, at:at + n].tolist() == list(range(n))
            real = batch.input_ids[i][batch.attention_mask[i].bool()]
            assert torch.equal(packed.input_ids[s, at:at + n], real)
            at += n
            seen += 1
    assert seen == len(lengths)
    assert packed.tokens == packed_cost(lengths, "masked") < len(lengths) * width


def test_token_budgets_count_the_packed_tokens() -> None:
    lengths = [40, 10, 10, 30, 5, 25, 20, 35]
    assert micro_batch_count(lengths, 120) == 3  # padded: 3·40, then 4·30 = 120, … — rows × longest
    assert packed_micro_batch_count(lengths, 120, "varlen") == 2  # Σℓ = 175: 40+35+30 | 25+20+10+10+5
    for kind in ("varlen", "masked"):
        for count in (1, 2, 3, 5, 8):
            groups = packed_micro_batches(lengths, count, kind)
            assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
            assert len(groups) == count
        k = packed_micro_batch_count(lengths, 90, kind)
        assert all(packed_cost([lengths[i] for i in g], kind) <= 90 for g in packed_micro_batches(lengths, k, kind))
    batch = random_batch(rows=12, seed=2, max_prompt=9, max_response=8)
    budget = 3 * max(row_lengths(batch))
    masked, _ = plan_micro_batches(batch, 4, budget, lambda k: k, packing="masked")
    for m in masked:  # what the budget counts is what the packed forward holds activations for
        assert pack_rows(m.input_ids, m.attention_mask, m.responses.shape[1], "masked").tokens <= budget
    padded, _ = plan_micro_batches(batch, 4, budget, lambda k: k)
    packed, order = plan_micro_batches(batch, 4, budget, lambda k: k, packing="varlen")
    assert (len(packed), len(padded)) == (3, 4)  # 132 real tokens fit 3 budgets of 51; padded they need 4
    assert sorted(order) == list(range(12))
    assert all(sum(row_lengths(m)) <= budget for m in packed)


def test_layout_follows_the_attention_implementation() -> None:
    model = build_tiny_lm()
    for impl, want in [("eager", "masked"), ("sdpa", "masked"), ("flash_attention_2", "varlen"),
                       ("flex_attention", None)]:
        model.config._attn_implementation = impl
        assert layout(model) == want
