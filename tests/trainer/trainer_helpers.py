"""Shared helpers for the trainer tests: random padded batches and simple policy-gradient losses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from engine.trainer.base import TrainBatch
from engine.trainer.batch import collate
from engine.types import Trajectory

PAD, EOS, VOCAB = 0, 1, 32


def build_tiny_lm(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    """`engine.models.tiny.build_tiny_model` over raw token ids (VOCAB, pad PAD, EOS EOS), init range 0.1;
    also seeds the global RNG with `seed`, as the tests expect."""
    from engine.models.tiny import build_tiny_model

    torch.manual_seed(seed)
    return build_tiny_model(VOCAB, PAD, EOS, seed=seed, layers=layers, initializer_range=0.1)


def build_tiny_moe_lm(seed: int = 0) -> torch.nn.Module:
    """A random 2-layer Qwen3-MoE over raw token ids (VOCAB; 4 experts, top-2), fp32."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=48,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, initializer_range=0.1,
                            max_position_embeddings=64, pad_token_id=PAD, eos_token_id=EOS)
    return Qwen3MoeForCausalLM(config)


def random_batch(rows: int = 10, seed: int = 0, max_prompt: int = 7, max_response: int = 6) -> TrainBatch:
    """Random prompts/responses of varied lengths (some ending in EOS) with random advantages."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(rows):
        p = int(torch.randint(2, max_prompt + 1, (1,), generator=gen))
        r = int(torch.randint(1, max_response + 1, (1,), generator=gen))
        response = torch.randint(2, 32, (r,), generator=gen).tolist()
        if bool(torch.rand(1, generator=gen) < 0.5):
            response[-1] = EOS
        items.append((torch.randint(2, 32, (p,), generator=gen).tolist(),
                      Trajectory(response, [-1.0] * r, "stop", 0, 0)))
    batch = collate(items, pad_token_id=PAD)
    batch.advantages = torch.randn(batch.responses.shape, generator=gen) * batch.response_mask
    return batch


def group_batch(groups: int = 3, n: int = 4, seed: int = 0):
    """`groups` prompts of different lengths, each with `n` responses of different lengths (one of 1 token, some
    ending in EOS), with random advantages — what a GRPO step trains on."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for g in range(groups):
        prompt = torch.randint(2, 32, (5 + 3 * g,), generator=gen).tolist()
        for i in range(n):
            length = 1 if i == 0 else int(torch.randint(2, 9, (1,), generator=gen))
            response = torch.randint(2, 32, (length,), generator=gen).tolist()
            if i % 2:
                response[-1] = EOS
            items.append((prompt, Trajectory(response, [-1.0] * length, "stop", 0, 0)))
    batch = collate(items, pad_token_id=PAD)
    batch.advantages = torch.randn(batch.responses.shape, generator=gen) * batch.response_mask
    return batch


def token_mean_pg_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: TrainBatch):
    """REINFORCE, token-mean within the micro-batch: −Σ A·log π·m / Σ m."""
    mask = mb.response_mask
    loss = -(mb.advantages * log_probs * mask).sum() / mask.sum().clamp(min=1.0)
    metrics = {"actor/pg_loss": float(loss.detach())}
    if entropy is not None:
        metrics["actor/entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1.0))
    return loss, metrics


def seq_mean_pg_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: TrainBatch):
    """REINFORCE, seq-mean-token-mean within the micro-batch: −mean_rows(Σ_t A·log π·m / Σ_t m)."""
    mask = mb.response_mask
    per_row = (mb.advantages * log_probs * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    loss = -per_row.mean()
    return loss, {"actor/pg_loss": float(loss.detach())}


def spawn_ranks(worker: Callable[..., None], world: int, out_dir: Path) -> list[dict]:
    """Run `worker(rank, world, port, out_dir)` in `world` spawned processes (each writes `out_dir/rank<r>.pt`)
    and return what each rank wrote, in rank order."""
    import torch.multiprocessing as mp

    from engine.trainer.fsdp import free_port

    mp.start_processes(worker, args=(world, free_port(), str(out_dir)), nprocs=world, join=True,
                       start_method="spawn")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


def agg_loss_fn(batch: TrainBatch, mode: str):
    """REINFORCE aggregated by verl's `loss_agg_mode` (`engine.algo.policy_loss.agg_loss`) within a micro-batch;
    sets `batch.meta["micro_weight_fn"]` to the mode's denominator, as `engine.algo.batching` does."""
    from engine.algo.policy_loss import agg_denominator, agg_loss

    batch.meta["micro_weight_fn"] = lambda mb: agg_denominator(mb.response_mask, mode)

    def loss_fn(log_probs: torch.Tensor, entropy: torch.Tensor | None, mb: TrainBatch):
        loss = agg_loss(-(mb.advantages * log_probs), mb.response_mask, mode)
        return loss, {"actor/pg_loss": float(loss.detach())}

    return loss_fn
