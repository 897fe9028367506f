"""Throughput of finished runs from their `metrics.jsonl`: `python scripts/run_throughput.py RUN_DIR...`.

Over the steady window, steps 2…K (step 1 includes the rollouter's head start while the trainer loads):

    steady_s        = asyncrl/time[K] − asyncrl/time[1]
    step_s          = steady_s / (K − 1)                            (wall time per step)
    gen_tokens_per_s = Σ_{k≥2} tokens_per_s_k · (time_k − time_{k−1}) / steady_s
                      (asyncrl/rollout/tokens_per_s is the tokens generated since the previous report ÷ that
                       interval, so the sum is the tokens generated in the window, validation included)
    trained_tokens_per_s = Σ_{k≥2} actor/response_tokens_k / steady_s
    gen_wait_s      = mean_{k≥2} timing_s/gen_k                      (the trainer waiting for rollouts)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def summary(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r and "asyncrl/time" in r]
    if len(steps) < 2:
        raise SystemExit(f"{run_dir}: fewer than 2 steps in metrics.jsonl")
    t = [float(r["asyncrl/time"]) for r in steps]
    steady = t[-1] - t[0]
    gen = sum(float(r.get("asyncrl/rollout/tokens_per_s", 0.0)) * (t[k] - t[k - 1])
              for k, r in enumerate(steps) if k >= 1)
    trained = sum(float(r.get("actor/response_tokens", 0.0)) for r in steps[1:])
    return {"steps": len(steps), "steady_s": steady, "step_s": steady / (len(steps) - 1),
            "median_step_s": statistics.median(float(r["timing_s/step"]) for r in steps[1:]),
            "gen_tokens_per_s": gen / steady, "trained_tokens_per_s": trained / steady,
            "gen_wait_s": statistics.mean(float(r.get("timing_s/gen", 0.0)) for r in steps[1:]),
            "final_reward": statistics.mean(float(r.get("critic/score/mean", r.get("reward/mean", 0.0)))
                                            for r in steps[-5:])}


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python scripts/run_throughput.py RUN_DIR...")
    print("| run | steps | step s | median step s | trainer gen wait s | generated tok/s | trained tok/s |")
    print("|---|---|---|---|---|---|---|")
    for d in argv:
        s = summary(Path(d))
        print(f"| {Path(d).name} | {s['steps']} | {s['step_s']:.3f} | {s['median_step_s']:.3f} | "
              f"{s['gen_wait_s']:.3f} | {s['gen_tokens_per_s']:.0f} | {s['trained_tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
