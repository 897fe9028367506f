"""Scoring finished trajectories with the configured reward (runs in the rollouter, streaming per group).

A reward function that raises or returns a non-number scores 0.0; the failure is counted
(`asyncrl/reward/errors`) and the run goes on. With `data.reward_manager = "dapo"` and
`data.overlong_buffer.enable`, the score gets DAPO's overlong penalty (`engine.data.rewards.overlong_penalty`);
with `overlong_buffer.log` the response's info carries `overlong_reward` and `overlong` (1.0 when penalised), as
verl's reward extra info.
"""

from __future__ import annotations

from typing import Any

from engine.plan.role_parts import ScoringSpec
from engine.types import Prompt, Trajectory


class Scorer:
    """Decodes responses and applies the reward chosen by `data.reward` (or by data_source when "auto"), from the
    rollouter's `ScoringSpec` (`engine.plan.role_parts.scoring_spec` of the `[data]` table)."""

    def __init__(self, spec: ScoringSpec, tokenizer: Any) -> None:
        self.reward_name = spec.reward
        self.max_response_length = spec.max_response_length
        self.overlong = spec.overlong
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
        score, info, _pred = self.score_answer(prompt, response_ids, finished)
        return score, info

    def score_answer(self, prompt: Prompt, response_ids: list[int],
                     finished: bool) -> tuple[float, dict[str, float], str | None]:
        """(score, numeric info, pred): the reward of one response, its overlong penalty applied, and the
        extracted answer when the reward reports one (validation's majority vote)."""
        from engine.data.rewards import score_with_pred

        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        score, info, pred, error = score_with_pred(self._fn(prompt.data_source), text, prompt.ground_truth,
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
        return float(score), info, pred

    def score_group(self, prompt: Prompt, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.reward, t.reward_info = self._score(prompt, t.response_ids, t.finish_reason == "stop")

    def counters(self) -> dict[str, float]:
        return {"asyncrl/reward/errors": self.errors}


def validation_record(scorer: Scorer, scored: list[tuple[Prompt, Any]], *, version: int, step: int,
                      turns: list[int] | None = None, tool_calls: list[int] | None = None) -> tuple[dict[str, Any], str]:
    """The metrics record of one validation and its one-line summary, named as verl names them.

    `scored` holds every answer (n per prompt with `rollout.val_n`). Per data source the variables are
    `reward` (the score) and every numeric entry of the reward's info (e.g. `acc`; `overlong_reward`,
    `overlong` of the DAPO manager); a string `pred` in the info is the vote of majority voting.
    `engine.telemetry.val_metrics.validation_metrics` turns them into verl's `mean@n`, `std@n`,
    `best@k`, `worst@k`, `maj@k` under `val-core/<source>/<var>/…` (the core variable: `acc`, else
    `reward`) and `val-aux/<source>/<var>/…`. Two asyncrl rules keep the record free of duplicates and
    ambiguity: `acc` counts only when every answer of the source reports it (else `reward` is core), and
    `reward` is left out when it equals `acc` answer by answer. Multi-turn (`turns`, `tool_calls`: per answer,
    its model turns and the tool calls it ran): verl's `val-aux/num_turns/{min,max,mean}`, and
    `asyncrl/val/tool_calls_per_answer` (calls / answers) with `asyncrl/val/tool_call_rate` (the share of
    answers with at least one call). Summary: `<source>=<core acc mean@n>` per source."""
    from engine.telemetry.val_metrics import Answer, validation_metrics

    rows: list[tuple[Prompt, float, dict[str, float], str | None]] = []
    for prompt, r in scored:
        score, info, pred = scorer.score_answer(prompt, r.response_ids, r.finish_reason == "stop")
        rows.append((prompt, score, info, pred))
    by_src: dict[str, list[tuple[Prompt, float, dict[str, float], str | None]]] = {}
    for row in rows:
        by_src.setdefault(row[0].data_source or "val", []).append(row)
    answers: list[Answer] = []
    for src, items in by_src.items():
        with_acc = all("acc" in info for _, _, info, _ in items)
        same = with_acc and all(float(info["acc"]) == score for _, score, info, _ in items)
        for prompt, score, info, pred in items:
            values = {} if same else {"reward": score}
            values.update({k: v for k, v in info.items() if k != "score" and (with_acc or k != "acc")})
            answers.append(Answer(prompt.uid, src, values, pred))
    rec: dict[str, Any] = {"training/global_step": step, "fully_async/count/current_param_version": version}
    rec.update(validation_metrics(answers))
    parts = []
    for src in by_src:
        core = [(k, v) for k, v in rec.items() if k.startswith(f"val-core/{src}/") and "/mean@" in k]
        for key, value in core:
            var = key[len(f"val-core/{src}/"):].split("/", 1)[0]
            at = "" if key.endswith("/mean@1") else f" ({key.rsplit('/', 1)[1]})"
            parts.append((f"{src}={value:.3f}" if var == "acc" else f"{src} reward={value:.3f}") + at)
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
