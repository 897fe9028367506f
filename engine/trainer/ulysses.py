"""Ulysses sequence parallelism (DeepSpeed-Ulysses, as verl's FSDP workers use it) for the torch/FSDP2 trainer.

The W trainer ranks form W / s sequence-parallel (SP) groups of s consecutive ranks (`sp_group`); the ranks of
one group hold the same rows (the data-parallel index of rank r is ⌊r / s⌋) and split each row's sequence.
A padded micro-batch [B, L] (left-padded prompts of width P, right-padded responses of width R) is first
left-aligned (`left_align`: row i's p_i padding positions move from its front to its end, its n_i tokens keep
their order and position ids), then right-padded to L' = s·⌈L / s⌉, and rank k of the group forwards positions
[k·L'/s, (k+1)·L'/s) through the decoder (`SequenceParallel.log_probs`). In a left-aligned row every real token
is preceded by real tokens only, so plain causal attention is exact for them — no [B, L, L] padding mask is
built (sdpa runs `is_causal`; eager gets one [L', L'] causal mask), and padding positions, which attend to real
tokens and padding, stay finite and are never read. Everything but attention acts on one position at a time,
so it runs on the rank's shard unchanged (rotary embeddings get the shard's position ids). Around attention an
all-to-all (`all_to_all`) turns sequence shards into head shards and back:

    q, k, v  [B, H, L'/s, D]  ──a2a──▶  [B, H/s, L', D]   (every position, the group's share of the heads)
    causal attention over the full left-aligned sequence
    out      [B, L', H/s, D]  ──a2a──▶  [B, L'/s, H, D]   (back to the rank's positions, every head)

so each head sees exactly the keys it sees without SP (s must divide H, and divide the KV heads or be a
multiple of them: with KV < s heads each KV head is repeated s / KV times before the all-to-all, as verl
does; the model's own eager / sdpa attention computes it). A vision-language model's vision tower and embedding
merge run on the full row on every rank; the shard starts at the language model's input (its embeddings, 3-D
positions and deepstack features are sliced to the shard there).

Log-probs: rank k computes log π(y_ij) = log_softmax(z_{i, P−p_i−1+j} / T)[y_ij] for the predicting positions
P − p_i − 1 + j (left-aligned) that fall in its shard, zero elsewhere; the group sums them (`all_reduce` whose
backward is the identity), so every rank holds the whole [B, R] log-probs and computes the same loss L. In backward rank k receives ∂L/∂ of
its own positions only, so its parameter gradient is its shard's part of ∇L (the all-to-alls route attention's
cross-shard terms), and Σ_k over the group is ∇L exactly. With FSDP2's average over the W ranks scaled by W
(`FSDPTrainerBackend._grad_scale`) and micro-batch masses summed over the W ranks divided by s (each group
counts its rows s times), the update is that of one process training on all rows:

    g = (1/W)·W·Σ_groups Σ_i (m_i / Σ m) Σ_{k∈group} ∇_k L_i = Σ_groups Σ_i (m_i / Σ m) ∇L_i

Token budgets are per SP group, as verl counts them: `ppo_max_token_len_per_gpu × s` (and the log-prob budget
likewise) per micro-batch of the group, i.e. per-GPU activations of ≈ budget tokens.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from engine.plan.sequence_parallel import ulysses_problem as check_sp
from engine.trainer.logprobs import chunked_token_log_probs, token_log_probs

ATTENTION_NAME = "asyncrl_ulysses"
"""The attention implementation registered with transformers while an SP forward runs."""
INNER_ATTENTION = ("eager", "sdpa")
"""Attention implementations the all-to-all wraps (causal: sdpa's `is_causal`, eager's additive [L', L'] mask)."""

_GROUPS: dict[tuple[int, int], Any] = {}


def sp_group(sp: int) -> Any:
    """This rank's SP group: ranks ⌊r/s⌋·s … ⌊r/s⌋·s + s − 1 of the default group. Collective: every rank
    creates every group (torch's rule for `new_group`), once per (world, s)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    key = (id(dist.distributed_c10d._get_default_group()), sp)
    if key not in _GROUPS:
        mine = None
        for start in range(0, world, sp):
            group = dist.new_group(list(range(start, start + sp)))
            if start <= rank < start + sp:
                mine = group
        _GROUPS.clear()
        _GROUPS[key] = mine
    return _GROUPS[key]


def _a2a(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Split `x` in s chunks along `scatter_dim`, send chunk k to group rank k, and concatenate the chunks
    received (in group rank order) along `gather_dim`."""
    s = dist.get_world_size(group)
    send = torch.stack(x.chunk(s, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _a2a(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _a2a(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Differentiable `_a2a`: its backward is the inverse all-to-all (gather_dim scattered back)."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _SumShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None  # every rank computes the same loss of the sum: ∂L/∂x_k = ∂L/∂sum


def sum_shards(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Σ over the SP group of each rank's `x` (its shard's entries, zero elsewhere); backward the identity
    (module docstring)."""
    return _SumShards.apply(x, group)


def left_align(attention_mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Gather index [B, L] that moves each row's left padding to its end: row i (left padding p_i) reads
    position (t + p_i) mod L at t, so its tokens sit at 0 … n_i − 1 in their order, padding after them."""
    length = attention_mask.shape[1]
    shift = (attention_mask[:, :prompt_width] == 0).sum(1)
    return (torch.arange(length, device=attention_mask.device)[None] + shift[:, None]) % length


def roll_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`x` [..., B, L] with each row gathered by `index` [B, L] along the last dim."""
    return x.gather(-1, index.expand_as(x))


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal mask [1, 1, L, L] (0 where key ≤ query, the dtype's minimum elsewhere): eager attention's,
    the same for every row of a left-aligned batch."""
    allowed = torch.ones((length, length), dtype=torch.bool, device=device).tril()
    return torch.zeros((length, length), dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)[
        None, None]


@dataclass
class _Shard:
    """The SP forward in progress: this rank's positions [lo, hi) of the padded length L'."""

    lo: int
    hi: int


class _Groups:
    """An attention module as the inner attention sees it: `num_key_value_groups` = the shard's query heads per
    KV head (H/s ÷ KV'/s), everything else the module's own."""

    def __init__(self, module: torch.nn.Module, groups: int) -> None:
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _slice_seq(x: Any, lo: int, hi: int) -> Any:
    return x[..., lo:hi] if isinstance(x, torch.Tensor) else x


class SequenceParallel:
    """Ulysses SP of one model over one SP `group` (module docstring). Construction registers the attention
    wrapper as the language model's attention implementation (for good: every forward of the model must go
    through `log_probs`) and a forward pre-hook that slices the language model's inputs inside `log_probs`."""

    def __init__(self, model: torch.nn.Module, group: Any) -> None:
        self.group, self.size, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        if decoder is None or not hasattr(decoder, "layers"):
            raise ValueError(f"Ulysses SP: cannot find the language model of {type(model).__name__}")
        self.decoder, self.config = decoder, decoder.config
        self.inner = self.config._attn_implementation
        if self.inner not in INNER_ATTENTION:
            raise ValueError(f"Ulysses SP needs attn_implementation eager or sdpa, got {self.inner!r}")
        why = check_sp(self.size, self.size, self.config.num_attention_heads,
                       getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads)
        if why:
            raise ValueError(why)
        self._inner_fn = self._inner_attention(decoder)
        self._shard: _Shard | None = None
        self._masks: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
        _register()
        decoder.register_forward_pre_hook(self._slice_inputs, with_kwargs=True)
        # for good, not per forward: a layer recomputed in backward (gradient checkpointing) must find it too
        self.config._attn_implementation = ATTENTION_NAME
        _ATTACHED.append(self)

    def _inner_attention(self, decoder: torch.nn.Module) -> Callable[..., Any]:
        if self.inner == "sdpa":
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward
        attn = decoder.layers[0].self_attn
        return sys.modules[type(attn).__module__].eager_attention_forward

    # --- inside the forward ---------------------------------------------------------------------------------
    def _slice_inputs(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Language-model inputs → this rank's positions: token ids or embeddings, position ids (any leading
        dims), the deepstack visual features of the shard's image tokens; no 2-D mask (the rows are left-aligned:
        attention is causal)."""
        shard = self._shard
        if shard is None:
            return None
        if args:
            raise ValueError("Ulysses SP: the language model must be called with keyword arguments")
        lo, hi = shard.lo, shard.hi
        out = dict(kwargs)
        for name in ("input_ids", "inputs_embeds"):
            if out.get(name) is not None:
                out[name] = out[name][:, lo:hi]
        out["position_ids"] = _slice_seq(out.get("position_ids"), lo, hi)
        out["attention_mask"] = None
        visual = out.get("visual_pos_masks")
        if visual is not None:
            flat = visual.nonzero()  # [N, 2] in row-major order: the order of the visual features
            keep = (flat[:, 1] >= lo) & (flat[:, 1] < hi)
            out["visual_pos_masks"] = visual[:, lo:hi]
            if out.get("deepstack_visual_embeds") is not None:
                out["deepstack_visual_embeds"] = [e[keep] for e in out["deepstack_visual_embeds"]]
        return (), out

    def attention(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        """q, k, v [B, H·, L'/s, D] of this rank's positions → the inner attention over all L' positions for H·/s
        heads → output [B, L'/s, H, D] (module docstring)."""
        if key.shape[1] % self.size:  # fewer KV heads than s: each one repeated s / KV times (verl's rule)
            rep = self.size // key.shape[1]
            key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
        q, k, v = (all_to_all(t, 1, 2, self.group) for t in (query, key, value))
        kwargs.pop("is_causal", None)
        groups = _Groups(module, q.shape[1] // k.shape[1])
        mask = self._causal(q) if self.inner == "eager" else None  # sdpa: is_causal, no mask
        out, _ = self._inner_fn(groups, q, k, v, mask, **kwargs)
        return all_to_all(out, 1, 2, self.group), None

    def _causal(self, q: torch.Tensor) -> torch.Tensor:
        key = (q.shape[2], q.dtype, q.device)
        if key not in self._masks:
            self._masks = {key: causal_mask(*key)}
        return self._masks[key]

    # --- the log-prob forward --------------------------------------------------------------------------------
    def log_probs(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        responses: torch.Tensor,
        temperature: float,
        with_entropy: bool = False,
        entropy_grad: bool = True,
        model_kwargs: Mapping[str, Any] | None = None,
        suppress_ids: Sequence[int] = (),
        chunk_tokens: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`engine.trainer.logprobs.response_log_probs` of a padded micro-batch with its sequence split over the
        group: the same [B, R] log-probs (and entropy) on every rank of the group, differentiable (module
        docstring). Every rank of the group must call it with the same rows."""
        b, length = input_ids.shape
        r = responses.shape[1]
        index = left_align(attention_mask, length - r)
        padded = -(-length // self.size) * self.size
        extra = padded - length

        def align(t: torch.Tensor) -> torch.Tensor:  # left padding to the end, then right-padded to L'
            t = roll_rows(t, index)
            return torch.nn.functional.pad(t, (0, extra)) if extra else t

        kwargs = {k: align(v) if k == "position_ids" else v for k, v in (model_kwargs or {}).items()}
        kwargs.setdefault("position_ids", align(position_ids))
        local = padded // self.size
        lo, hi = self.rank * local, (self.rank + 1) * local
        # response token j of row i is predicted at position first_i + j of its left-aligned row; this shard holds
        # j ∈ [j0_i, j0_i + W) ∩ [0, R) with first_i + j ∈ [lo, hi): static shapes [B, W], W = min(R, L'/s)
        first = length - r - 1 - index[:, 0]  # index[:, 0] = the row's left padding
        width = min(r, local)
        j = (lo - first).clamp(0, r)[:, None] + torch.arange(width, device=index.device)
        where = first[:, None] + j
        valid = (j < r) & (where >= lo) & (where < hi)
        at = (where - lo).clamp(0, local - 1)
        slot = torch.where(valid, j, r)  # column r collects nothing (zeros), then is dropped
        head = model.get_output_embeddings()
        plain_forward = head.forward

        def shard_head(hidden: torch.Tensor) -> torch.Tensor:
            # hidden [B, L'/s, H] of positions lo … hi − 1 → [B, R, 2] = (log π, H), zero off this shard
            h = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))
            tokens = responses.gather(1, j.clamp(max=r - 1))
            if chunk_tokens:
                picked, ent = chunked_token_log_probs(h, plain_forward, tokens, temperature, with_entropy,
                                                      entropy_grad, suppress_ids, chunk_tokens)
            else:
                picked, ent = token_log_probs(plain_forward(h), tokens, temperature, with_entropy, entropy_grad,
                                              suppress_ids)
            both = torch.stack([picked, ent if ent is not None else torch.zeros_like(picked.detach())], dim=-1)
            both = both * valid[..., None]
            full = both.new_zeros((b, r + 1, 2)).scatter_add(1, slot[..., None].expand(-1, -1, 2), both)
            return sum_shards(full[:, :r], self.group)

        head.forward = shard_head
        self._shard = _Shard(lo, hi)
        try:
            out = model(input_ids=align(input_ids), attention_mask=align(attention_mask), use_cache=False,
                        logits_to_keep=0, **kwargs)
        finally:
            self._shard = None
            del head.forward
        result = out.logits
        entropy = result[..., 1] if with_entropy else None
        if entropy is not None and not entropy_grad:
            entropy = entropy.detach()
        return result[..., 0], entropy


_ATTACHED: list[SequenceParallel] = []
"""The language models under SP in this process (the policy's and the reference's)."""


def _dispatch(module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function: the SP of the language model that holds `module`."""
    for sp in _ATTACHED:
        if sp.config is module.config:
            return sp.attention(module, *args, **kwargs)
    raise RuntimeError("Ulysses attention of a model without sequence parallelism")


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _dispatch)
