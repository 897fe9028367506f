"""Token selection from next-token logits, with the log-prob of the chosen token (pure torch functions).

The sampling distribution for temperature T > 0, top-k k and top-p p is

    q(v) ∝ exp(z_v / T) · 1[v ∈ K_k] · 1[v ∈ N_p]

where z are the raw logits, K_k the k highest-scoring tokens (all tokens when k = 0) and N_p the nucleus:
with tokens sorted by descending probability π (of softmax(z/T) restricted to K_k), token i is kept iff
the mass strictly before it, Σ_{j<i} π_j, is < p (so the top token is always kept; p = 1 keeps all).
The reported log-prob is log q(token), i.e. `log_softmax` of the filtered logits — with k = 0 and p = 1
exactly `log_softmax(z / T)`, which is what the trainer recomputes.

T = 0 is greedy: token = argmax z, reported under T = 1 without filtering: log softmax(z)[token].

The uniform u of a draw comes from a `torch.Generator` (one stream per `generate` call), or is given per row
(`uniforms`): deterministic mode keys it by (seed, request id, response position) with `engine.rollout.hf.keyed`,
so a token does not depend on which other rows were sampled before it.
"""

from __future__ import annotations

import torch

from engine.rollout.base import SamplingParams


def filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set the logits outside the top-k set and the top-p nucleus to -inf. `scaled` = z / T, [N, V]."""
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kept = torch.topk(scaled, top_k, dim=-1).indices
        keep = torch.zeros_like(scaled, dtype=torch.bool).scatter_(-1, kept, True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def select_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [N, V] and return `(tokens [N] long, log_probs [N] float32)`.

    Sampling draws from q (see the module docstring) by inverting its CDF at one uniform per row from
    `generator` (≈10× cheaper than `torch.multinomial` over a 50k vocabulary on CPU), so a seeded generator
    makes the draw reproducible for the same logits; greedy ignores the generator. `uniforms` [N] in [0, 1),
    when given, replace the generator's draws (one per row).
    """
    logits = logits.float()
    if params.temperature <= 0.0:
        tokens = torch.argmax(logits, dim=-1)
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, log_probs
    filtered = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    log_q = torch.log_softmax(filtered, dim=-1)
    tokens = sample_from_cdf(log_q.exp(), generator, uniforms)
    return tokens, log_q.gather(-1, tokens[:, None]).squeeze(-1)


def sample_from_cdf(probs: torch.Tensor, generator: torch.Generator | None,
                    uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row of `probs` [N, V]: the first v with CDF(v) > u·CDF(V−1), u ~ U[0, 1).

    Zero-probability tokens are never returned: their CDF equals their predecessor's, so they are never the
    *first* index above u (the last index, chosen only if rounding puts u at the very top, is replaced by
    the most likely token when it has zero mass)."""
    cdf = probs.cumsum(dim=-1)
    if uniforms is None:
        uniforms = torch.rand((probs.shape[0],), generator=generator, device=probs.device, dtype=cdf.dtype)
    u = uniforms.to(device=probs.device, dtype=cdf.dtype)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
    empty = probs.gather(-1, tokens[:, None]).squeeze(-1) <= 0
    if bool(empty.any()):
        tokens = torch.where(empty, probs.argmax(dim=-1), tokens)
    return tokens
