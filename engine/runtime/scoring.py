"""Scoring finished trajectories with the configured reward (runs in the rollouter, streaming per group).

A reward function that raises or returns a non-number scores 0.0; the failure is counted
(`asyncrl/reward/errors`) and the run goes on.
"""

from __future__ import annotations

from typing import Any

from engine.types import Prompt, Trajectory

ValScore = tuple[float, float | None]
"""One validation response's (reward, acc) — acc None when the reward function reports none."""


def validation_record(per_source: dict[str, list[ValScore]], step: int, version: int) -> tuple[dict[str, Any], str]:
    """The validation metrics record, named as verl names them, and a one-line summary.

    Per data source, over its responses (one greedy sample each, hence `@1`): when the reward reports `acc`,
    `val-core/<source>/acc/mean@1` is its mean and the reward's mean goes beside it as
    `val-aux/<source>/reward/mean@1`; without `acc`, `val-core/<source>/reward/mean@1` is the reward's mean.
    The record carries `training/global_step` and the validated version."""
    rec: dict[str, Any] = {"training/global_step": step, "fully_async/count/current_param_version": version}
    parts = []
    for src, scores in per_source.items():
        rewards = [r for r, _ in scores]
        accs = [a for _, a in scores if a is not None]
        reward = sum(rewards) / len(rewards)
        if len(accs) == len(scores):
            acc = sum(accs) / len(accs)
            rec[f"val-core/{src}/acc/mean@1"] = acc
            rec[f"val-aux/{src}/reward/mean@1"] = reward
            parts.append(f"{src} acc={acc:.3f}" + (f" (reward {reward:.3f})" if reward != acc else ""))
        else:
            rec[f"val-core/{src}/reward/mean@1"] = reward
            parts.append(f"{src} reward={reward:.3f}")
    return rec, ", ".join(parts)


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

    def validation_scores(self, prompt: Prompt, response_ids: list[int], finish_reason: str) -> ValScore:
        """(reward, acc or None) of one validation response (`validation_record` names them)."""
        score, info = self._score(prompt, response_ids, finish_reason == "stop")
        return score, info.get("acc")

    def counters(self) -> dict[str, float]:
        return {"asyncrl/reward/errors": self.errors}


REWARD_ERROR_REPORTS = (1, 10, 100, 1000, 10000)
"""Reward-failure counts at which an event is written (the counter `asyncrl/reward/errors` has them all)."""


def reward_errors_message(seen: int, errors: int, last_error: str | None) -> str | None:
    """The event text when the failure count crossed 1, 10, 100, ... since `seen` (each scored 0.0)."""
    if not any(seen < k <= errors for k in REWARD_ERROR_REPORTS):
        return None
    return f"the reward function failed on {errors} response(s) so far; each scored 0.0 (last: {last_error})"


def filtered_message(epoch: int, counters: dict[str, int]) -> str | None:
    """The event text when rendering dropped training prompts (empty, or over data.max_prompt_length)."""
    empty, long = counters.get("filtered_empty", 0), counters.get("filtered_overlong", 0)
    if not empty + long:
        return None
    return (f"{empty + long} of {counters.get('rows', 0)} training prompts filtered out in epoch {epoch}: "
            f"{empty} empty, {long} over data.max_prompt_length (counters data/filtered_*)")
