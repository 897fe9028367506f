"""Ulysses sequence parallelism's rules (pure: `validate` and the trainer share them; the mechanism is
`engine.trainer.ulysses`).

With s = `trainer.ulysses_sequence_parallel_size` over M trainer ranks (torch / FSDP2 backend):

    groups of s consecutive ranks share their rows:  DP = M / s          (s | M)
    attention heads split over the group:            s | H,  and  s | KV  or  KV | s   (KV < s: each KV head
                                                     repeated s / KV times, as verl does)
    token budget of one SP group's micro-batch:      ppo_max_token_len_per_gpu × s   (verl's count)
    per-rank sequence (activations) of a row of L:   ⌈L / s⌉ positions
"""

from __future__ import annotations


def ulysses_problem(sp: int, world: int, heads: int, kv_heads: int) -> str | None:
    """Why `sp` cannot split attention over `world` ranks of a model with `heads` / `kv_heads` (one line), or
    None when it can (module docstring)."""
    if sp < 1:
        return f"ulysses_sequence_parallel_size must be >= 1, got {sp}"
    if world % sp:
        return f"ulysses_sequence_parallel_size = {sp} must divide the trainer's {world} ranks"
    if heads % sp or (kv_heads % sp and sp % kv_heads):
        return (f"ulysses_sequence_parallel_size = {sp} must divide the model's {heads} attention heads, and "
                f"divide or be a multiple of its {kv_heads} KV heads")
    return None


def group_budget(per_gpu: int, sp: int) -> int:
    """Tokens per micro-batch of one SP group: verl's `ppo_max_token_len_per_gpu × ulysses_sequence_parallel_size`."""
    return per_gpu * sp

