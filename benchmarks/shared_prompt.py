"""Study 16 — the shared-prompt forward (`trainer.shared_prompt`, `engine.trainer.shared_prefix`): one GRPO
update (`train_step`) of the demo's batch — 4 prompts × 8 responses of the full 40 tokens (the least sharing
can save: real responses are shorter) — with each group's prompt forwarded once, against the same batch as 32
padded rows. Each arm runs in fresh worker processes (`benchmarks.trainer_worker`: the backend built as the
engine builds it, a warm-up step, then the median of `steps` timed steps), the arms interleaved, `repeats`
processes each; the winner is claimed only when every repeat of one arm lies beyond the other's whole range
(`benchmarks.elastic_cores.beyond`).

    speedup = padded update seconds ÷ shared update seconds          (by repeat, and of the medians)

Size `attention` runs the shared arm twice instead, eager against sdpa attention (speedup = sdpa seconds ÷
eager seconds): whether the kernel `trainer.attn_implementation = "auto"` picks from its one-attention probe is
the faster one for the whole update.

Both arms train the same batch from the same weights, so their gradient norms agree up to bf16 rounding
(recorded; the exact equality in fp32 is a unit test, tests/trainer/test_shared_prompt.py). The full size pins
the precision and attention the demo's `auto` chose on the machines it was measured on (bf16, eager), with
the trainer on 2 threads, as in the demo.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import new_result, publish, table
from benchmarks.elastic_cores import beyond
from benchmarks.plots import pyplot, save
from benchmarks.trainer_throughput import measure

STUDY = "shared-prompt"
ARMS = {"shared": ["trainer.shared_prompt=true"], "padded": ["trainer.shared_prompt=false"]}
SIZES: dict[str, dict[str, Any]] = {
    "full": {"preset": "smollm2-arith-cpu.toml", "steps": 3, "threads": 2, "repeats": 3,
             "overrides": ['trainer.precision="bf16"', 'trainer.attn_implementation="eager"']},
    # the attention kernel at the shared sequences (what `trainer.attn_implementation = "auto"` now times)
    "attention": {"preset": "smollm2-arith-cpu.toml", "steps": 3, "threads": 2, "repeats": 3,
                  "overrides": ['trainer.precision="bf16"', "trainer.shared_prompt=true"],
                  "arms": {"eager": ['trainer.attn_implementation="eager"'],
                           "sdpa": ['trainer.attn_implementation="sdpa"']}},
    "toy": {"preset": "tiny-cpu.toml", "steps": 1, "threads": 1, "repeats": 1,
            "overrides": ["trainer.ppo_mini_batch_size=4", "rollout.n=4", "trainer.ppo_micro_batch_size_per_gpu=16",
                         'trainer.attn_implementation="eager"']},
}


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    spec = SIZES[size]
    arms = spec.get("arms", ARMS)
    result = new_result(STUDY, size, {**spec, "arms": arms})
    rows = []
    for repeat in range(spec["repeats"]):
        for arm, extra in arms.items():
            out = measure(spec["preset"], [*spec["overrides"], *extra], "torch", spec["steps"], spec["threads"])
            rows.append({"arm": arm, "repeat": repeat, **out})
    result["rows"] = rows
    first, second = arms  # speedup = second arm's seconds ÷ first arm's
    step = {arm: [r["step_s"] for r in rows if r["arm"] == arm and "step_s" in r] for arm in arms}
    ratios = [p["step_s"] / s["step_s"] for s, p in zip(*(sorted((r for r in rows if r["arm"] == a and "step_s" in r),
                                                                  key=lambda r: r["repeat"]) for a in arms))]
    result["summary"] = {
        f"{first}_step_s": step[first], f"{second}_step_s": step[second], "speedup_by_repeat": ratios,
        "speedup_of_medians": (statistics.median(step[second]) / statistics.median(step[first])
                               if step[first] and step[second] else None),
        "winner": {"a": first, "b": second}.get(
            beyond(step[second], step[first]) or ""),  # "a": every update of the second arm took longer
    }
    result["tables"] = [table(
        f"One GRPO update of {spec['preset']}'s batch, {spec['threads']} thread(s), median of {spec['steps']} steps "
        "after a warm-up, per worker process",
        ["arm", "repeat", "rows", "tokens", "tokens forwarded ÷", "update (s)", "update tokens/s", "grad norm",
         "note"],
        [[r["arm"], r["repeat"], r.get("rows", ""), r.get("tokens", ""),
          round(r["shared_prompt_saving"], 2) if "shared_prompt_saving" in r else "",
          round(r["step_s"], 2) if "step_s" in r else "", round(r["tokens_per_s"], 1) if "tokens_per_s" in r else "",
          round(r["grad_norm"], 4) if "grad_norm" in r else "", f"skipped: {r['error']}" if "error" in r else ""]
         for r in rows])]
    result["targets"] = []
    result["notes"] = [
        "'tokens forwarded ÷' = the padded rows' tokens ÷ the tokens the forward ran on "
        "(`asyncrl/trainer/shared_prompt_saving`; 1 = not shared).",
        f"precision and attention pinned: {', '.join(spec['overrides'])}.",
    ]
    return publish(result, started, out_dir, lambda: plot(rows, out_dir))


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for i, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm and "step_s" in r]
        ax.scatter([i] * len(mine), [r["step_s"] for r in mine], label=arm)
    ax.set_xticks(range(len(arms)), arms)
    ax.set(ylabel="update seconds (median of steps)", title=" vs ".join(arms))
    ax.set_ylim(bottom=0)
    return save(fig, out_dir, STUDY)
