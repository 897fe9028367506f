"""Deterministic generation for the `hf` sampler (`trainer.deterministic = true`): keyed draws, one group alone.

**Keyed draws.** The uniform of the draw for response position t of request `rid` (`"{prompt uid}#{sample
index}"`) under seed s is

    u(s, rid, t) = (first 8 bytes of BLAKE2b-64(s ‖ rid ‖ t) as an integer, >> 11) / 2^53   ∈ [0, 1)

— a counter-based hash, not a generator stream, so the token drawn there depends only on the key and on the
logits, never on how many draws other rows made before it (a resumed run, a sync or async run, or another
dispatch packing all draw the same u for the same position).

**One group alone, fixed shapes.** Logits of one row can change in the last bits with the batch they are
computed in (other rows' padding widths and batch sizes pick other kernels). `generate_alone` therefore runs the
rows of one prompt (its `n` samples: request ids that share the part before `#`) as one batch of its own:
prefill of the `n` left-padded contexts, then decode steps over all `n` rows until every row has finished —
finished rows keep decoding (their tokens are discarded), so every forward of a group has the same shape in
every run. Given the weights, the contexts and the keys, the result is a pure function.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.decode import ForwardAdapter, RowOutput, RowSpec, left_pad
from engine.rollout.hf.kv_cache import make_cache
from engine.rollout.hf.sampling import select_tokens

_SCALE = float(2 ** 53)


def keyed_uniform(seed: int, request_id: str, position: int) -> float:
    """u(seed, request_id, position) ∈ [0, 1) (see the module docstring)."""
    h = hashlib.blake2b(f"{int(seed)}\x1f{request_id}\x1f{int(position)}".encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / _SCALE


def group_of(request_id: str) -> str:
    """The prompt a request belongs to: its id without the `#sample` suffix."""
    return request_id.rsplit("#", 1)[0]


def split_groups(request_ids: Sequence[str]) -> list[list[int]]:
    """Indices of `request_ids` grouped by prompt, groups in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, rid in enumerate(request_ids):
        groups.setdefault(group_of(rid), []).append(i)
    return list(groups.values())


def generate_alone(forward: ForwardAdapter, rows: Sequence[RowSpec], keys: Sequence[str],
                   offsets: Sequence[int], sampling: SamplingParams, *, eos_ids: set[int], pad_id: int,
                   device: torch.device) -> list[RowOutput]:
    """Generate `rows` (one prompt's samples, each budget > 0) as one batch of their own with keyed draws.
    `keys[i]` is row i's request id, `offsets[i]` the response tokens it already has (its draw positions
    start there). Finished rows stay in the batch until the last one finishes (fixed shapes)."""
    n = len(rows)
    outs = [RowOutput() for _ in rows]
    if n == 0:
        return outs
    seed = 0 if sampling.seed is None else int(sampling.seed)
    ids, mask = left_pad([r.context for r in rows], pad_id, device)
    budget = max(r.budget for r in rows)
    cache = make_cache(getattr(forward.model, "config", None), ids.shape[1] + budget + 1)
    logits, rope = forward.prefill(ids, mask, cache, [r.images for r in rows])
    next_pos = torch.tensor([len(r.context) for r in rows], dtype=torch.long, device=device)
    alive = [True] * n
    for _ in range(budget):
        u = torch.tensor([keyed_uniform(seed, keys[i], offsets[i] + len(outs[i].tokens)) for i in range(n)],
                         dtype=torch.float64)
        tokens, log_probs = select_tokens(logits, sampling, None, uniforms=u)
        token_list, lp_list = tokens.tolist(), log_probs.tolist()
        for i in range(n):
            if not alive[i]:
                continue
            outs[i].tokens.append(token_list[i])
            outs[i].log_probs.append(lp_list[i])
            if token_list[i] in eos_ids:
                outs[i].finish_reason, alive[i] = "stop", False
            elif len(outs[i].tokens) >= rows[i].budget:
                outs[i].finish_reason, alive[i] = "length", False
        if not any(alive):
            break
        mask = torch.cat([mask, mask.new_ones((n, 1))], dim=1)
        logits = forward.step(tokens, mask, next_pos + rope, cache)
        next_pos = next_pos + 1
    return outs
