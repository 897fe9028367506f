"""Scoring finished trajectories with the configured reward (runs in the rollouter, streaming per group).

A reward function that raises or returns a non-number scores 0.0; the failure is counted
(`asyncrl/reward/errors`) and the run goes on. With `data.reward_manager = "dapo"` and
`data.overlong_buffer.enable`, the score gets DAPO's overlong penalty (`engine.data.rewards.overlong_penalty`);
with `overlong_buffer.log` the response's info carries `overlong_reward` and `overlong` (1.0 when penalised), as
verl's reward extra info.
"""

from __future__ import annotations

from typing import Any

from engine.config.schema import RunConfig
from engine.types import Prompt, Trajectory


class Scorer:
    """Decodes responses and applies the reward chosen by `data.reward` (or by data_source when "auto")."""

    def __init__(self, cfg: RunConfig, tokenizer: Any) -> None:
        self.reward_name = cfg.data.reward
        self.max_response_length = cfg.data.max_response_length
        ob = cfg.data.overlong_buffer
        self.overlong = ob if cfg.data.reward_manager == "dapo" and ob.enable else None
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
        info = {k: float(v) for k, v in (info or {}).items() if isinstance(v, (int, float))}
        if self.overlong is not None:
            from engine.data.rewards import overlong_penalty

            penalty = overlong_penalty(len(response_ids), self.max_response_length, self.overlong.len,
                                       self.overlong.penalty_factor)
            score += penalty
            if self.overlong.log:
                info["overlong_reward"], info["overlong"] = penalty, float(penalty < 0)
        return float(score), info

    def score_group(self, prompt: Prompt, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.reward, t.reward_info = self._score(prompt, t.response_ids, t.finish_reason == "stop")

    def counters(self) -> dict[str, float]:
        return {"asyncrl/reward/errors": self.errors}


def validation_record(scorer: Scorer, scored: list[tuple[Prompt, Any]], *, version: int, step: int,
                      turns: list[int] | None = None, tool_calls: list[int] | None = None) -> tuple[dict[str, Any], str]:
    """The metrics record of one validation and its one-line summary, named as verl names them.

    Per data source, over one greedy answer per prompt (`@1`): when the reward reports `acc`,
    `val-core/<source>/acc/mean@1` is its mean and, when the shaped reward differs from it,
    `val-aux/<source>/reward/mean@1` goes beside it (verl files every variable but the core one under
    `val-aux`); a reward without `acc` gives `val-core/<source>/reward/mean@1`. Every other numeric entry of the
    reward's info (e.g. `overlong_reward`, `overlong` of the DAPO manager) gives `val-aux/<source>/<key>/mean@1`.
    Multi-turn (`turns`, `tool_calls`: per answer, its model turns and the tool calls it ran): verl's
    `val-aux/num_turns/{min,max,mean}`, and `asyncrl/val/tool_calls_per_answer` (calls / answers) with
    `asyncrl/val/tool_call_rate` (the share of answers with at least one call)."""
    acc: dict[str, list[float | None]] = {}
    reward: dict[str, list[float]] = {}
    extra: dict[str, dict[str, list[float]]] = {}
    for prompt, r in scored:
        score, info = scorer._score(prompt, r.response_ids, r.finish_reason == "stop")
        src = prompt.data_source or "val"
        acc.setdefault(src, []).append(float(info["acc"]) if "acc" in info else None)
        reward.setdefault(src, []).append(float(score))
        for key, value in info.items():
            if key not in ("acc", "score"):
                extra.setdefault(src, {}).setdefault(key, []).append(value)
    rec: dict[str, Any] = {"training/global_step": step, "fully_async/count/current_param_version": version}
    parts = []
    for src, accs in acc.items():
        rewards = reward[src]
        mean_reward = sum(rewards) / len(rewards)
        if all(a is not None for a in accs):
            mean_acc = sum(a for a in accs if a is not None) / len(accs)
            rec[f"val-core/{src}/acc/mean@1"] = mean_acc
            if rewards != accs:
                rec[f"val-aux/{src}/reward/mean@1"] = mean_reward
            parts.append(f"{src}={mean_acc:.3f}")
        else:
            rec[f"val-core/{src}/reward/mean@1"] = mean_reward
            parts.append(f"{src} reward={mean_reward:.3f}")
        for key, values in extra.get(src, {}).items():
            rec[f"val-aux/{src}/{key}/mean@1"] = sum(values) / len(values)
    if turns:
        rec.update({"val-aux/num_turns/min": min(turns), "val-aux/num_turns/max": max(turns),
                    "val-aux/num_turns/mean": sum(turns) / len(turns)})
    if tool_calls:
        rec["asyncrl/val/tool_calls_per_answer"] = sum(tool_calls) / len(tool_calls)
        rec["asyncrl/val/tool_call_rate"] = sum(1 for k in tool_calls if k > 0) / len(tool_calls)
        parts.append(f"tool calls in {rec['asyncrl/val/tool_call_rate']:.0%} of answers")
    return rec, ", ".join(parts)


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
