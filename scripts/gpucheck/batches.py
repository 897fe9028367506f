"""Synthetic prompts, a verifiable toy reward, and the path from generation results to a `TrainBatch` —
the same collation and GRPO advantages the runtime uses (`engine.trainer.batch.collate`,
`engine.algo.advantages.grpo_advantages`).

Reward of a response y (token ids): r(y) = |{t : y_t even}| / |y|  (0 for an empty response) — a random
policy scores ~0.5 and GRPO can raise it, so an async loop's reward curve shows learning, not just motion.
"""

from __future__ import annotations

import torch

from engine.algo.advantages import grpo_advantages
from engine.algo.policy_loss import agg_denominator
from engine.trainer.base import TrainBatch
from engine.trainer.batch import collate
from engine.types import GenRequest, GenResult, Prompt, Trajectory, TrajectoryGroup


def random_prompts(count: int, length: int, vocab: int, avoid: set[int], seed: int) -> list[list[int]]:
    """`count` prompts of `length` uniform token ids in [0, vocab) \\ `avoid` (e.g. the EOS id)."""
    g = torch.Generator().manual_seed(seed)
    out: list[list[int]] = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append([t if t not in avoid else (t + 1) % vocab for t in ids])
    return out


def requests_for(prompts: list[list[int]], n: int, max_new_tokens: int, tag: str) -> list[GenRequest]:
    """`n` requests per prompt, ids `{tag}-{prompt}-{sample}`, grouped prompt-major."""
    return [
        GenRequest(f"{tag}-{i}-{k}", list(p), max_new_tokens=max_new_tokens)
        for i, p in enumerate(prompts)
        for k in range(n)
    ]


def parity_reward(response_ids: list[int]) -> float:
    """Fraction of even token ids in the response (see the module docstring)."""
    return sum(1 for t in response_ids if t % 2 == 0) / len(response_ids) if response_ids else 0.0


def groups_from_results(
    prompts: list[list[int]], n: int, results: list[GenResult], epoch: int = 0
) -> list[TrajectoryGroup]:
    """One `TrajectoryGroup` per prompt from the prompt-major `results` of `requests_for(prompts, n, ...)`."""
    if len(results) != len(prompts) * n:
        raise ValueError(f"{len(results)} results for {len(prompts)} prompts × n={n}")
    groups = []
    for i, prompt in enumerate(prompts):
        trajs = [
            Trajectory(
                r.response_ids,
                r.log_probs,
                r.finish_reason,
                r.min_version,
                r.max_version,
                reward=parity_reward(r.response_ids),
            )
            for r in results[i * n : (i + 1) * n]
        ]
        groups.append(TrajectoryGroup(Prompt(f"{epoch}:{i}", i, epoch, list(prompt)), trajs))
    return groups


def train_batch(groups: list[TrajectoryGroup], pad_id: int, loss_agg_mode: str = "token-mean") -> TrainBatch:
    """Collated rows with group-normalised GRPO advantages and the loss's own micro-batch mass."""
    batch = collate(groups, pad_id)
    rewards = torch.tensor([t.reward for g in groups for t in g.trajectories], dtype=torch.float32)
    group_ids = [gi for gi, g in enumerate(groups) for _ in g.trajectories]
    adv = grpo_advantages(rewards, group_ids, norm_by_std=True)
    batch.advantages = adv[:, None] * batch.response_mask
    batch.meta["micro_weight_fn"] = lambda mb: agg_denominator(mb.response_mask, loss_agg_mode)
    return batch


def batch_tokens(batch: TrainBatch) -> int:
    """Tokens the trainer processes: every non-padding position of every row."""
    return int(batch.attention_mask.sum())
