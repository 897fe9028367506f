"""Study 1 — async vs sync: the same preset with `mode = "sync"` and `mode = "fully_async"` for the same
number of trained prompts on the same cores.

Reported per preset: wall time, trained prompts/s, the ratio (achieved speedup = async prompts/s ÷ sync
prompts/s, both over the steady state, steps 2…K — see `RunSummary`), the ideal speedup
(T_gen + T_train) / max(T_gen, T_train) from the sync run's phase times over the same steps, the overlap
efficiency = achieved ÷ ideal, and the final reward of both (mean ± s.e. over the last 20 % of steps). The
plot shows both reward curves against wall time and against steps.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, new_result, publish, sig, table
from benchmarks.engine_runs import SYNC_OVERRIDES, RunSummary, launch, ray_session
from benchmarks.metrics import ideal_speedup, overlap_efficiency, within_noise
from benchmarks.plots import bars, pyplot, save
from benchmarks.targets import evaluate

STUDY = "async-vs-sync"
COMMON = ("trainer.test_freq=0", "trainer.val_before_train=false")
TOY_SHAPE = ("trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4")

CASES: dict[str, list[dict[str, Any]]] = {
    "full": [
        {"name": "tiny", "preset": "tiny-cpu.toml", "overrides": ["rollout.total_rollout_steps=6400"]},
        # SmolLM2 on CPU costs minutes per step at n=8: 8 trained steps (32 prompts) only.
        {
            "name": "smollm2",
            "preset": "smollm2-arith-cpu.toml",
            "overrides": ["rollout.total_rollout_steps=32"],
        },
    ],
    "toy": [
        {
            "name": "tiny",
            "preset": "tiny-cpu.toml",
            "overrides": [*TOY_SHAPE, "rollout.total_rollout_steps=8"],
        }
    ],
}


def compare(name: str, sync: RunSummary, fast: RunSummary) -> dict[str, Any]:
    """The headline numbers of one preset from its sync and async runs."""
    achieved = fast.prompts_per_s / sync.prompts_per_s
    ideal = ideal_speedup(sync.t_gen, sync.t_train)
    return {
        "preset": name,
        "speedup": achieved,
        "speedup_end_to_end": sync.wall_s / fast.wall_s,
        "speedup_median_step": sync.median_step_s / fast.median_step_s,
        "ideal_speedup": ideal,
        "overlap_efficiency": overlap_efficiency(achieved, ideal),
        "reward_within_noise": within_noise(
            fast.final_reward, fast.final_reward_se, sync.final_reward, sync.final_reward_se
        ),
        "sync": sync.to_json(),
        "async": fast.to_json(),
    }


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    cases = CASES[size]
    result = new_result(
        STUDY,
        size,
        {"cases": cases, "common_overrides": list(COMMON), "sync_overrides": list(SYNC_OVERRIDES)},
    )
    comparisons = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp, ray_session():
        for case in cases:
            preset = PRESETS / case["preset"]
            base = [*COMMON, *case["overrides"]]
            sync = launch(preset, [*base, *SYNC_OVERRIDES], Path(tmp), f"{case['name']}-sync")
            fast = launch(preset, base, Path(tmp), f"{case['name']}-async")
            comparisons.append(compare(case["name"], sync, fast))
    result["comparisons"] = comparisons
    result["tables"] = _tables(comparisons)
    for c in comparisons:
        p = c["preset"]
        result["targets"] += [
            evaluate(f"async ÷ sync ({p})", round(c["speedup"], 3), 1.6, ">=", "×"),
            evaluate(f"overlap efficiency ({p})", round(c["overlap_efficiency"], 3), 0.85, ">="),
            evaluate(f"final reward within noise of sync ({p})", c["reward_within_noise"], True, "true"),
        ]
    result["notes"] = [
        (
            "Speedups compare trained prompts/s over steps 2…K on the trainer's clock (`asyncrl/time`): the "
            "first step is dropped because the rollouter starts generating while the trainer still loads its "
            "model. The end-to-end ratio (`run()` wall, Ray and model start-up included) is in the table too, "
            "and so is the ratio of median step times, which steps stalled by other processes on a shared "
            "machine do not move."
        ),
        (
            "On CPU the sync run gives each phase every core (they alternate), while fully async splits the cores "
            "between the trainer and the rollout replica (`engine/runtime/driver.py::_placement`): the ideal "
            "speedup assumes each phase keeps its sync duration when overlapped, which core-splitting cannot "
            "deliver when both phases are compute-bound on the same cores — that, not the scheduling, bounds "
            "the overlap efficiency here."
        ),
        "Validation is off (`trainer.test_freq=0`) so that both runs time the same work.",
    ]
    if size == "full":
        result["notes"].append(
            "SmolLM2 runs are 8 trained steps (32 prompts × n=8): its final reward is "
            "a short-run indication, not a converged curve."
        )
    return publish(result, started, out_dir, lambda: plot(comparisons, out_dir))


def _tables(comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    runs, heads = [], []
    for c in comparisons:
        for mode in ("sync", "async"):
            s = c[mode]
            runs.append(
                [
                    c["preset"],
                    mode,
                    s["trained_prompts"],
                    s["steps"],
                    round(s["steady_wall_s"], 2),
                    round(s["train_wall_s"], 2),
                    round(s["wall_s"], 1),
                    sig(s["prompts_per_s"]),
                    round(s["median_step_s"], 3),
                    round(s["t_gen"], 2),
                    round(s["t_train"], 2),
                    f"{s['final_reward']:.3f} ± {s['final_reward_se']:.3f}",
                ]
            )
        heads.append(
            [
                c["preset"],
                round(c["speedup"], 2),
                round(c["speedup_end_to_end"], 2),
                round(c["speedup_median_step"], 2),
                round(c["ideal_speedup"], 2),
                round(c["overlap_efficiency"], 2),
                "yes" if c["reward_within_noise"] else "no",
            ]
        )
    return [
        table(
            "Runs",
            [
                "preset",
                "mode",
                "trained prompts",
                "steps",
                "steps 2…K wall (s)",
                "trainer wall (s)",
                "end-to-end wall (s)",
                "prompts/s (steps 2…K)",
                "median step (s)",
                "T_gen (s)",
                "T_train (s)",
                "final reward",
            ],
            runs,
        ),
        table(
            "Speedup",
            [
                "preset",
                "async ÷ sync",
                "end-to-end ratio",
                "median-step ratio",
                "ideal",
                "overlap efficiency",
                "reward within noise",
            ],
            heads,
        ),
    ]


def plot(comparisons: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(len(comparisons), 3, figsize=(13, 3.6 * len(comparisons)), squeeze=False)
    for row, c in zip(axes, comparisons):
        for mode, color in (("sync", "tab:blue"), ("async", "tab:orange")):
            curve = c[mode]["curve"]
            row[0].plot(curve["time"], curve["reward"], color=color, label=mode)
            row[1].plot(curve["step"], curve["reward"], color=color, label=mode)
        row[0].set(
            xlabel="trainer wall time (s)", ylabel="mean reward", title=f"{c['preset']}: reward vs time"
        )
        row[1].set(xlabel="step", ylabel="mean reward", title=f"{c['preset']}: reward vs step")
        for ax in row[:2]:
            ax.legend(fontsize=8)
            ax.title.set_fontsize(10)
        bars(
            row[2],
            ["sync", "fully async"],
            [c["sync"]["prompts_per_s"], c["async"]["prompts_per_s"]],
            ylabel="trained prompts / s",
            title=f"{c['preset']}: {c['speedup']:.2f}× (ideal {c['ideal_speedup']:.2f}×)",
            colors=["tab:blue", "tab:orange"],
        )
    return save(fig, out_dir, STUDY)
