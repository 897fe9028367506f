"""Scoring finished trajectories with the configured reward (runs in the rollouter, streaming per group).

A reward function that raises or returns a non-number scores 0.0; the failure is counted
(`asyncrl/reward/errors`) and the run goes on.
"""

from __future__ import annotations

from typing import Any

from engine.types import Prompt, Trajectory


class Scorer:
    """Decodes responses and applies the reward chosen by `data.reward` (or by data_source when "auto")."""

    def __init__(self, cfg: Any, tokenizer: Any) -> None:
        self.reward_name = cfg.data.reward
        self.tokenizer = tokenizer
        self._fns: dict[str, Any] = {}
        self.errors = 0
        self.last_error: str | None = None

    def _fn(self, data_source: str):
        from engine.data.rewards import get_reward_fn

        if data_source not in self._fns:
            self._fns[data_source] = get_reward_fn(self.reward_name, data_source)
        return self._fns[data_source]

    def _score(self, prompt: Prompt, response_ids: list[int], finished: bool) -> tuple[float, dict[str, float]]:
        from engine.data.rewards import safe_score

        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        score, info, error = safe_score(self._fn(prompt.data_source), text, prompt.ground_truth,
                                        data_source=prompt.data_source, extra_info=prompt.extra_info,
                                        finished=finished)
        if error is not None:
            self.errors += 1
            self.last_error = error
        return float(score), {k: float(v) for k, v in (info or {}).items() if isinstance(v, (int, float))}

    def score_group(self, prompt: Prompt, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.reward, t.reward_info = self._score(prompt, t.response_ids, t.finish_reason == "stop")

    def accuracy(self, prompt: Prompt, response_ids: list[int], finish_reason: str) -> float:
        """Validation score: the reward's `acc` (correctness without shaping bonuses) when it reports one."""
        score, info = self._score(prompt, response_ids, finish_reason == "stop")
        return info.get("acc", score)

    def counters(self) -> dict[str, float]:
        return {"asyncrl/reward/errors": self.errors}
