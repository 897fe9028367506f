"""The Megatron backend's log-prob head: log π (and the entropy H) of the response tokens from vocab-parallel
logits, a bounded number of positions at a time.

`chunked_log_probs`: the logits [b, S, V/tp] (model dtype) are read at the response positions `response_index`
[b, R] in column chunks of `chunk_tokens // b` positions; each chunk's fp32 [b, chunk, V/tp] slice is turned into
log-probs (`vocab_parallel.vocab_parallel_log_probs`) and, under autograd, recomputed in backward
(`torch.utils.checkpoint`), so no fp32 tensor larger than [chunk_tokens, V/tp] exists at once — on the forward or
the backward. The entropy is computed only when asked (`with_entropy`: a loss that uses it, or the
`actor/entropy` metric).

`owned_log_probs` (context parallelism, cp > 1): CP rank r holds the logits of its sequence positions only
(`context_parallel.chunk_positions`). It compacts, per row, the response positions it owns to the front
(a stable sort of the "not owned" flag: n = the most any row owns, about R / cp), runs `chunked_log_probs` on
those n columns alone, and scatters the results back to [b, R] with zeros where it owns nothing; the sum over
the CP group (`context_parallel.sum_over_cp`) then gives every rank the full [b, R]. So a CP rank's head costs
what its own positions cost, chunked like the cp = 1 path.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint


def chunked_log_probs(logits: torch.Tensor, response_index: torch.Tensor, responses: torch.Tensor, *,
                      temperature: float, vocab_size: int, chunk_tokens: int | None,
                      with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π (and H) [b, R] of `responses` from `logits` [b, S, V/tp] at `response_index` [b, R] (module
    docstring); `chunk_tokens` None: one chunk."""
    from engine.trainer.megatron.vocab_parallel import vocab_parallel_log_probs

    rows, width = responses.shape
    chunk = max(1, (chunk_tokens or responses.numel()) // max(1, rows))

    def one(start: int) -> tuple[torch.Tensor, torch.Tensor]:
        def run(lg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            idx = response_index[:, start : start + chunk]
            z = lg.gather(1, idx.unsqueeze(-1).expand(-1, -1, lg.shape[-1])).float() / temperature
            lp, ent = vocab_parallel_log_probs(z, responses[:, start : start + chunk], vocab_size, with_entropy)
            return lp, ent if ent is not None else lp.new_zeros(())
        if torch.is_grad_enabled() and logits.requires_grad and chunk < width:
            return torch.utils.checkpoint.checkpoint(run, logits, use_reentrant=False)
        return run(logits)

    parts = [one(start) for start in range(0, width, chunk)]
    entropy = torch.cat([e for _, e in parts], dim=1) if with_entropy else None
    return torch.cat([lp for lp, _ in parts], dim=1), entropy


def owned_log_probs(logits: torch.Tensor, local_index: torch.Tensor, owned: torch.Tensor, responses: torch.Tensor, *,
                    temperature: float, vocab_size: int, chunk_tokens: int | None,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This CP rank's share of log π (and H) [b, R]: its local `logits` [b, S/cp, V/tp] read at `local_index`
    [b, R] where `owned` [b, R], zero elsewhere (module docstring)."""
    rows, width = responses.shape
    n = int(owned.sum(dim=1).max()) if owned.numel() else 0
    lp_full = torch.zeros(rows, width, dtype=torch.float32, device=responses.device)
    ent_full = torch.zeros_like(lp_full) if with_entropy else None
    if n == 0:  # this rank holds no response position of these rows
        return lp_full + logits.sum() * 0.0, ent_full  # keeps the graph (every rank runs the same backward)
    order = torch.argsort((~owned).to(torch.int8), dim=1, stable=True)[:, :n]  # owned columns first, per row
    mine = owned.gather(1, order)
    lp, ent = chunked_log_probs(logits, local_index.gather(1, order), responses.gather(1, order),
                                temperature=temperature, vocab_size=vocab_size, chunk_tokens=chunk_tokens,
                                with_entropy=with_entropy)
    lp_full = lp_full.scatter(1, order, torch.where(mine, lp, torch.zeros_like(lp)))
    if ent_full is not None and ent is not None:
        ent_full = ent_full.scatter(1, order, torch.where(mine, ent, torch.zeros_like(ent)))
    return lp_full, ent_full
