"""Predictions for docs/benchmarks.md (issue 45): for seed 000 and DeepSeek-V3, the update time per local step, the
sync time and the rollout memory per GPU with bf16 or fp8 rollout weights, and with the Megatron settings the
backend builds (resolved for the preset's device) or the fast configuration verl runs (Transformer Engine spec,
grouped GEMM, all-to-all, overlapped reduce, packed rows: `engine.plan.megatron_perf.FAST`, efficiency 1.0).

Everything is `asyncrl plan`'s and `asyncrl validate`'s arithmetic (no measurement):

    python scripts/frontier_plan.py            # a markdown table on stdout
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl_cli.commands._common import analyze  # noqa: E402
from asyncrl_cli.config.fit import estimate_fit  # noqa: E402
from engine.plan.megatron_perf import FAST  # noqa: E402
from engine.predict.costs import Layout, resolve  # noqa: E402
from engine.predict.prediction import simulate  # noqa: E402

PRESETS = {"seed 000 (Qwen3-30B-A3B, 96:32 H20)": "qwen3-30b-a3b-base-dapo-megatron-96-32.toml",
           "DeepSeek-V3 (128:128 H100)": "deepseek-v3-gsm8k-megatron-256.toml"}


def row(name: str, preset: str, fp8: bool, fast: bool) -> str:
    sets = ['rollout.quantization="fp8"'] if fp8 else []
    an = analyze(ROOT / "presets" / "runs" / preset, sets)
    layout = Layout.from_config(an.config, an.derived.total_train_steps, an.hardware.device)
    if fast:
        layout = dataclasses.replace(layout, megatron_perf=dict(FAST))
    costs = resolve(layout, an.model, an.hardware)
    p = simulate(layout, costs)
    per_token, per_step = costs.train_at(layout.trainer_world)
    tokens = layout.required_samples * layout.n * costs.mean_response(layout.max_new_tokens)
    update = per_step + per_token * tokens  # one local step's training compute at the mean response length
    ro = estimate_fit(an.config, an.model, an.hardware).rollout
    return (f"| {name} | {'fp8' if fp8 else 'bf16'} | {'fast (verl)' if fast else 'as built'} | {update:,.1f} s | "
            f"{costs.sync_s:.2f} s | {ro.components_gb['weights']:.1f} GB / {ro.total_gb:.1f} GB | "
            f"{p.step_time_s:,.1f} s |")


def main() -> None:
    print("| run | rollout weights | Megatron settings | update time per local step | sync | rollout GPU: "
          "weights / total | plan's step time |")
    print("|---|---|---|---|---|---|---|")
    for name, preset in PRESETS.items():
        for fp8 in (False, True):
            for fast in (False, True):
                print(row(name, preset, fp8, fast), flush=True)


if __name__ == "__main__":
    main()
