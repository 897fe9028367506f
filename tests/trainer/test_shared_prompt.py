"""The shared-prompt forward (`engine.trainer.shared_prefix`): a GRPO group's rows forwarded as one sequence, the
prompt once, give the padded forward's log-probs, entropy and — after two optimizer updates — its weights, on
dense and MoE models, with eager and sdpa attention, with the chunked head; and it forwards fewer tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import PAD, build_tiny_lm, build_tiny_moe_lm, group_batch, token_mean_pg_loss

from engine.trainer.batch import collate
from engine.trainer.shared_prefix import pack, worth_sharing
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import Trajectory

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}
BUILDERS = {"dense": build_tiny_lm, "moe": build_tiny_moe_lm}


def make(model: torch.nn.Module, **kw: object) -> TorchTrainerBackend:
    return TorchTrainerBackend(model, **({"optim_cfg": OPTIM, "grad_clip": 1e6, "micro_batch_size": 12} | kw))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_shared_prompt_log_probs_equal_the_padded_rows(kind: str, attn: str) -> None:
    model = BUILDERS[kind]()
    model.config._attn_implementation = attn
    batch = group_batch()
    plain = make(copy.deepcopy(model), shared_prompt=False, entropy="metric")
    shared = make(model, entropy="metric")
    want, want_h = plain.compute_log_probs(batch, with_entropy=True)
    got, got_h = shared.compute_log_probs(batch, with_entropy=True)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(got[mask], want[mask], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got_h[mask], want_h[mask], atol=2e-5, rtol=1e-5)
    assert plain.take_forward_saving() == 1.0
    assert shared.take_forward_saving() > 1.3  # 12 padded rows → 3 sequences


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("mode", [{}, {"logprob_chunk_tokens": 5}], ids=["plain-head", "chunked-head"])
def test_two_updates_with_shared_prompts_equal_the_padded_ones(kind: str, mode: dict) -> None:
    model = BUILDERS[kind]()
    model.config._attn_implementation = "eager"
    plain = make(copy.deepcopy(model), shared_prompt=False, **mode)
    shared = make(model, **mode)
    for seed in (0, 1):
        batch = group_batch(seed=seed)
        a, b = plain.train_step(batch, token_mean_pg_loss), shared.train_step(batch, token_mean_pg_loss)
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5, abs=1e-7)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
        assert a["asyncrl/trainer/shared_prompt_saving"] == 1.0
        assert b["asyncrl/trainer/shared_prompt_saving"] > 1.3
    moved = False
    for (name, p), q, p0 in zip(plain.model.named_parameters(), shared.model.parameters(), BUILDERS[kind]().parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)
        moved |= not torch.equal(p, p0)
    assert moved


def test_pack_lets_each_response_see_its_prompt_and_itself_only() -> None:
    batch = group_batch(groups=2, n=3)
    packed = pack(batch.input_ids, batch.attention_mask, batch.responses.shape[1])
    assert packed.input_ids.shape[0] == 2
    allowed = packed.mask[:, 0] == 0
    prompt0 = 5  # group 0: a 5-token prompt, then responses of 1, a, b tokens
    lengths = batch.attention_mask[:3, batch.prompt_len:].sum(-1).tolist()
    starts = [prompt0, prompt0 + lengths[0], prompt0 + lengths[0] + lengths[1]]
    for i, (s, n) in enumerate(zip(starts, lengths)):
        last = s + n - 1
        assert allowed[0, last, :prompt0].all()  # the whole prompt
        assert allowed[0, last, s:last + 1].all()  # its own tokens up to itself
        others = [j for k, (t, m) in enumerate(zip(starts, lengths)) if k != i for j in range(t, t + m)]
        assert not allowed[0, last, others].any()  # never another response
        assert packed.position_ids[0, s].item() == prompt0  # each response continues the prompt's positions
    # the first response token of every row is predicted by the prompt's last position
    assert packed.predictors[:3, 0].tolist() == [prompt0 - 1] * 3


def test_sharing_is_skipped_where_it_does_not_apply() -> None:
    model = build_tiny_lm()
    batch = group_batch()
    r = batch.responses.shape[1]
    model.config._attn_implementation = "eager"
    assert worth_sharing(model, batch.input_ids, batch.attention_mask, r)
    distinct = collate([([3 + i, 4, 5], Trajectory([6, 7], [-1.0, -1.0], "stop", 0, 0)) for i in range(6)],
                       pad_token_id=PAD)
    assert not worth_sharing(model, distinct.input_ids, distinct.attention_mask, distinct.responses.shape[1])
    model.config._attn_implementation = "flash_attention_2"  # takes no arbitrary mask
    assert not worth_sharing(model, batch.input_ids, batch.attention_mask, r)
