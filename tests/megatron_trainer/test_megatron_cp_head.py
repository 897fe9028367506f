"""The context-parallel log-prob head (`context_parallel.forward_log_probs`, cp > 1: CUDA + Transformer Engine at
run time) on the CP-split inputs it gets there: each CP rank's share, summed over the ranks, equals the full head's
log-probs, entropy and gradient, and no rank ever holds an fp32 logits tensor larger than `logprob_chunk_tokens`
positions × V (the head used to materialise fp32 [b, R, V] for every response position at once).

Stand-ins, for the parts that need a CP group: megatron-core's parallel-state getters (this rank's CP index and
size), the sum over the CP group (the test sums the ranks' shares itself) and the TP = 1 reductions of
`vocab_parallel` (identity at TP = 1). The model is a bf16 embedding table from tokens to logits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.trainer.megatron import context_parallel, vocab_parallel

pytestmark = pytest.mark.megatron

V, SEQ, ROWS, R, CHUNK, TEMP = 64, 48, 3, 30, 6, 0.7


class Fp32Logits(TorchDispatchMode):
    """Records the most positions (numel / V) of any fp32 tensor with V in its last dim made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() and t.shape[-1] == V:
                self.most = max(self.most, t.numel() // V)
        return out


@pytest.fixture
def one_rank_at_a_time(monkeypatch):
    import megatron.core.parallel_state as ps

    state = {"rank": 0}
    monkeypatch.setattr(ps, "get_context_parallel_world_size", lambda: 2)
    monkeypatch.setattr(ps, "get_context_parallel_rank", lambda: state["rank"])
    monkeypatch.setattr(ps, "get_context_parallel_group", lambda: None)
    monkeypatch.setattr(context_parallel, "sum_over_cp", lambda x, group: x)  # the test sums the shares
    monkeypatch.setattr(vocab_parallel, "_tp", lambda: (None, 1, 0))
    monkeypatch.setattr(vocab_parallel, "_reduce_sum", lambda x: x)
    return state


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    table = torch.nn.Parameter((torch.randn(100, V, generator=g) * 2).to(torch.bfloat16))
    tokens = torch.randint(0, 100, (ROWS, SEQ), generator=g)
    starts = torch.tensor([2, 10, 17])  # rows' responses begin at different positions (prompt lengths)
    response_index = starts[:, None] + torch.arange(R)[None, :]
    responses = torch.randint(0, V, (ROWS, R), generator=g)
    inp = SimpleNamespace(tokens=tokens, position_ids=torch.arange(SEQ).expand(ROWS, -1),
                          response_index=response_index, shape=(ROWS, SEQ))
    backend = SimpleNamespace(ddp=lambda tok, pos, mask: table[tok], temperature=TEMP,
                              arch=SimpleNamespace(vocab_size=V), logprob_chunk_tokens=CHUNK)
    return table, inp, backend, responses


def test_the_cp_head_sums_to_the_full_head_and_never_holds_more_than_a_chunk(one_rank_at_a_time) -> None:
    table, inp, backend, responses = _case()
    weights = torch.randn(ROWS, R, generator=torch.Generator().manual_seed(1))
    lp_sum, ent_sum, most = 0.0, 0.0, []
    for rank in range(2):
        one_rank_at_a_time["rank"] = rank
        with Fp32Logits() as seen:
            lp, ent = context_parallel.forward_log_probs(backend, inp, responses, True, ROWS)
            ((lp * weights).sum() + ent.sum()).backward()
        most.append(seen.most)
        lp_sum, ent_sum = lp_sum + lp.detach(), ent_sum + ent.detach()
    got_grad = table.grad.clone()

    table.grad = None
    z = table[inp.tokens].gather(1, inp.response_index[..., None].expand(-1, -1, V)).float() / TEMP
    logp = torch.log_softmax(z, dim=-1)
    want_lp = logp.gather(-1, responses[..., None]).squeeze(-1)
    want_ent = -(logp.exp() * logp).sum(-1)
    ((want_lp * weights).sum() + want_ent.sum()).backward()
    assert torch.allclose(lp_sum, want_lp, atol=1e-5) and torch.allclose(ent_sum, want_ent, atol=1e-5)
    assert torch.allclose(got_grad.float(), table.grad.float(), atol=1e-2, rtol=1e-2)
    assert max(most) <= CHUNK < ROWS * R // 2  # a chunk of positions, not the rank's [b, R] (nor its half)


def test_entropy_only_when_asked_and_a_rank_without_response_positions(one_rank_at_a_time) -> None:
    table, inp, backend, responses = _case(2)
    lp, ent = context_parallel.forward_log_probs(backend, inp, responses, False, ROWS)
    assert ent is None and lp.shape == (ROWS, R)
    inp.response_index = torch.arange(4)[None, :].expand(ROWS, -1)  # all in rank 0's first chunk
    one_rank_at_a_time["rank"] = 1
    lp, _ = context_parallel.forward_log_probs(backend, inp, responses[:, :4], False, ROWS)
    assert torch.equal(lp.detach(), torch.zeros(ROWS, 4))
    lp.sum().backward()  # the rank still joins the backward (a zero gradient)
    assert table.grad is not None and not table.grad.any()
