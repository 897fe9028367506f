"""The data that flows through the loop.

One `TrajectoryGroup` per prompt: it is the only thing that crosses the message queue, and it is what a
checkpoint saves for queued and in-flight work. Plain dataclasses of Python lists (no tensors) so they pickle
cheaply through Ray and serialise to JSON for checkpoints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling distribution. Log-probs are reported under exactly this distribution:
    log softmax(logits / temperature) restricted by top-k / top-p (0 / 1.0 = off). temperature 0 = greedy
    (log-probs then reported under temperature 1)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class Prompt:
    """One prompt of the stream, already tokenised.

    `uid` is unique across the epoch (`"{epoch}:{index}"`), so the ledger can account for it exactly once.

    `images` (multimodal prompts): the prompt's images in placeholder order, each the base64 text of its
    encoded file (PNG/JPEG bytes) — compact to pickle and JSON-ready. `prompt_ids` then already holds each
    image's placeholder expanded to its vision-token count; pixel values are a pure function of the image and
    the model's image processor, recomputed where needed (`engine.multimodal`).
    """

    uid: str
    index: int
    epoch: int
    prompt_ids: list[int]
    ground_truth: str = ""
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)


@dataclass
class GenRequest:
    """One sequence to generate: a prompt plus (on resume) the prefix already generated.

    `max_new_tokens` is the *remaining* budget: a resumed request never gets a fresh full budget (verl #7207).
    `images` are the prompt's (`Prompt.images`), carried again with a resumed prefix.
    """

    request_id: str
    prompt_ids: list[int]
    prefix_ids: list[int] = field(default_factory=list)
    prefix_log_probs: list[float] = field(default_factory=list)
    max_new_tokens: int = 64
    min_version: int | None = None  # version that produced the first prefix token, if any
    images: list[str] = field(default_factory=list)  # base64 encoded images of a multimodal prompt


@dataclass
class GenResult:
    """The outcome of one `GenRequest` on a replica (the whole response so far, prefix included)."""

    request_id: str
    response_ids: list[int]
    log_probs: list[float]  # log π_rollout(token) under the sampling distribution, one per response token
    finish_reason: FinishReason
    min_version: int
    max_version: int
    new_tokens: int = 0  # tokens generated in this call (excludes the resumed prefix)


@dataclass
class Trajectory:
    """One response of a group, with its version stamps and reward."""

    response_ids: list[int]
    rollout_log_probs: list[float]
    finish_reason: FinishReason
    min_version: int
    max_version: int
    reward: float = 0.0
    reward_info: dict[str, float] = field(default_factory=dict)
    loss_mask: list[int] | None = None
    """Multi-turn: 1 for each model token, 0 for the tools' answers and their template tokens (excluded from
    the loss and the log-prob diagnostics); None = every response token is the model's."""
    turns: int = 1
    """Model turns in the response (1 for a single-turn rollout)."""
    tool_calls: int = 0
    """Tool calls run for this response."""

    @property
    def version_span(self) -> int:
        """max_version − min_version: > 0 means it was resumed across a weight update (partial rollout)."""
        return self.max_version - self.min_version


@dataclass
class TrajectoryGroup:
    """A prompt with its `rollout.n` finished trajectories: the unit of streaming (verl's RolloutSample)."""

    prompt: Prompt
    trajectories: list[Trajectory]
    generated_at: float = 0.0  # wall clock when the last trajectory finished
    gen_seconds: float = 0.0  # wall time from admission to completion
    admitted_version: int = 0  # rollouter's weight version when the prompt was admitted

    @property
    def min_version(self) -> int:
        return min(t.min_version for t in self.trajectories)

    @property
    def max_version(self) -> int:
        return max(t.max_version for t in self.trajectories)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TrajectoryGroup":
        return TrajectoryGroup(
            prompt=Prompt(**d["prompt"]),
            trajectories=[Trajectory(**t) for t in d["trajectories"]],
            generated_at=d.get("generated_at", 0.0),
            gen_seconds=d.get("gen_seconds", 0.0),
            admitted_version=d.get("admitted_version", 0),
        )
