"""The rehearsal's micro-batches: the preset's largest, padded as the trainer pads them.

A row is a prompt of `data.max_prompt_length` tokens and a response of `data.max_response_length` (the longest
the rollout can return), so every row is as long as a row can be: L = P + R positions. The update's micro-batch
holds max(1, ⌊T / L⌋) such rows for a token budget T (`ppo_max_token_len_per_gpu` with `use_dynamic_bsz`; × s, an
SP group's budget, with Ulysses SP s on the torch backend — each rank then forwards L / s positions of them), or
`ppo_micro_batch_size_per_gpu` rows without one; the log-prob passes' the same for
`log_prob_max_token_len_per_gpu`. The rows go through the trainer's own `collate` (left-padded prompts,
right-padded responses, the response mask from the lengths) and, in the backend, its own micro-batch split and
`trim_padding`, so the positions a rank forwards are the ones the trainer would forward.

Token ids are drawn below 100 000 (no special or image-placeholder ids); the rows carry no images (a
vision-language preset is rehearsed on its language model's token budget; the vision tower's own activations
are not in the measured peak).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.plan.sequence_parallel import group_budget
from engine.trainer.batch import collate
from engine.types import Trajectory

if TYPE_CHECKING:
    from engine.config.schema import RunConfig
    from engine.trainer.base import TrainBatch

MAX_TOKEN_ID = 100_000


@dataclass(frozen=True)
class MicroShape:
    """The rows and positions of one rehearsed micro-batch."""

    rows: int
    prompt: int
    response: int
    budget: int | None
    """The token budget the rows fill (None: `ppo_micro_batch_size_per_gpu` rows)."""

    @property
    def positions(self) -> int:
        """Padded positions the micro-batch forwards (rows × (prompt + response))."""
        return self.rows * (self.prompt + self.response)

    def to_json(self) -> dict[str, int | None]:
        return {"rows": self.rows, "prompt": self.prompt, "response": self.response, "budget": self.budget,
                "positions": self.positions}


def micro_shape(cfg: RunConfig, log_prob: bool = False) -> MicroShape:
    """The update's (or, with `log_prob`, the log-prob passes') largest micro-batch (module docstring)."""
    t, d = cfg.trainer, cfg.data
    length = d.max_prompt_length + d.max_response_length
    if t.use_dynamic_bsz:
        budget = int((t.log_prob_max_token_len_per_gpu or t.ppo_max_token_len_per_gpu) if log_prob
                     else t.ppo_max_token_len_per_gpu)
        if t.backend == "torch":  # Ulysses: an SP group's micro-batch holds budget × s (verl's count)
            budget = group_budget(budget, t.ulysses_sequence_parallel_size)
        return MicroShape(max(1, budget // length), d.max_prompt_length, d.max_response_length, budget)
    return MicroShape(int(t.ppo_micro_batch_size_per_gpu), d.max_prompt_length, d.max_response_length, None)


def rehearsal_batch(shape: MicroShape, vocab: int, pad_id: int = 0, seed: int = 0) -> TrainBatch:
    """`shape.rows` full-length rows through `collate`, with advantages, old and reference log-probs and IS
    weights set (every loss input the trainer may read)."""
    g = torch.Generator().manual_seed(seed)
    high = min(vocab, MAX_TOKEN_ID)
    rows = []
    for _ in range(shape.rows):
        prompt = torch.randint(1, high, (shape.prompt,), generator=g).tolist()
        response = torch.randint(1, high, (shape.response,), generator=g).tolist()
        rows.append((prompt, Trajectory(response, [-1.0] * len(response), "length", 0, 0)))
    batch = collate(rows, pad_id)
    r = batch.responses.shape[1]
    batch.advantages = torch.ones(len(batch), r)
    batch.old_log_probs = batch.rollout_log_probs.clone()
    batch.ref_log_probs = batch.rollout_log_probs.clone()
    batch.is_weights = torch.ones(len(batch), r)
    return batch
