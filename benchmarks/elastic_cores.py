"""Study — elastic cores: async ÷ sync on the tiny preset with and without lending the waiting role's threads.

Three arms of `presets/runs/tiny-cpu.toml` for the same number of trained prompts on the same cores, each over
several seeds (`trainer.seed` = `data.seed` = s), interleaved seed by seed so that drift in the machine's load
hits every arm alike:

    sync       `mode = "sync"` (each phase every core, strictly alternating)
    async      fully async, the plan's fixed split (`resources.elastic_cores = false`, today's default)
    elastic    fully async with `resources.elastic_cores = true` (`engine.loop.elastic`)

Per run (`benchmarks.engine_runs.RunSummary`): trained prompts/s over steps 2…K on the trainer's clock, the
median step, the end-to-end wall, the final reward (mean over the last 20 % of steps), and the time to reward
`REWARD_LEVEL` (the first step whose `WINDOW`-step moving mean of `critic/rewards/mean` reaches it, on the
trainer's clock). Per arm: mean and sample standard deviation over seeds; the ratios async ÷ sync and
elastic ÷ sync (prompts/s, and sync's time-to-level ÷ the arm's) per seed, with their min…max. A winner is
claimed only when every seed's ratio of one arm lies beyond the other arm's whole range.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, new_result, publish, table
from benchmarks.engine_runs import SYNC_OVERRIDES, RunSummary, launch, ray_session
from benchmarks.plots import pyplot, save

STUDY = "elastic-cores"
COMMON = ("trainer.test_freq=0", "trainer.val_before_train=false")
ARMS: dict[str, tuple[str, ...]] = {
    "sync": SYNC_OVERRIDES,
    "async": ("resources.elastic_cores=false",),
    "elastic": ("resources.elastic_cores=true",),
}
SIZES: dict[str, dict[str, Any]] = {
    "full": {"seeds": [0, 1, 2], "overrides": ["rollout.total_rollout_steps=6400"]},  # 200 steps of 32 prompts
    "toy": {"seeds": [0], "overrides": ["trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size_per_gpu=16",
                                        "rollout.n=4", "rollout.total_rollout_steps=8"]},
}
REWARD_LEVEL = 0.5
"""The reward level timed (tiny's copy task: sync reaches ~0.69, async ~0.61 by step 200 — study 1)."""
WINDOW = 10
MIN_SEEDS = 3
"""No winner is named from fewer seeds per arm."""


def time_to_level(curve: dict[str, list[float]], level: float = REWARD_LEVEL, window: int = WINDOW) -> float | None:
    """Trainer-clock time of the first step whose `window`-step moving mean reward reaches `level` (None: never)."""
    rewards, times = curve["reward"], curve["time"]
    for k in range(window - 1, len(rewards)):
        if sum(rewards[k - window + 1:k + 1]) / window >= level:
            return float(times[k])
    return None


def spread(values: list[float]) -> dict[str, float]:
    """mean, sample sd (0 for one value), min, max."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def beyond(a: list[float], b: list[float]) -> str | None:
    """"a" when every value of `a` exceeds every value of `b`, "b" the other way round, else None (within the
    spread: no winner; also with fewer than `MIN_SEEDS` values on either side)."""
    if len(a) < MIN_SEEDS or len(b) < MIN_SEEDS:
        return None
    if min(a) > max(b):
        return "a"
    if min(b) > max(a):
        return "b"
    return None


def compare(runs: dict[str, dict[int, RunSummary]]) -> dict[str, Any]:
    """Per-seed ratios against sync and their spread (see the module docstring)."""
    seeds = sorted(runs["sync"])
    out: dict[str, Any] = {"seeds": seeds, "arms": {}, "ratios": {}}
    for arm, by_seed in runs.items():
        ttl = [time_to_level(by_seed[s].curve) for s in seeds]
        out["arms"][arm] = {
            "prompts_per_s": spread([by_seed[s].prompts_per_s for s in seeds]),
            "median_step_s": spread([by_seed[s].median_step_s for s in seeds]),
            "wall_s": spread([by_seed[s].wall_s for s in seeds]),
            "final_reward": spread([by_seed[s].final_reward for s in seeds]),
            "time_to_level_s": [t for t in ttl],
        }
    for arm in ("async", "elastic"):
        thr = [runs[arm][s].prompts_per_s / runs["sync"][s].prompts_per_s for s in seeds]
        lvl = []
        for s in seeds:
            a, b = time_to_level(runs["sync"][s].curve), time_to_level(runs[arm][s].curve)
            if a is not None and b is not None:
                lvl.append(a / b)
        out["ratios"][arm] = {"throughput": thr, "time_to_level": lvl}
    thr_winner = beyond(out["ratios"]["elastic"]["throughput"], out["ratios"]["async"]["throughput"])
    lvl_winner = beyond(out["ratios"]["elastic"]["time_to_level"], out["ratios"]["async"]["time_to_level"])
    names = {"a": "elastic", "b": "async", None: "none (within the spread)"}
    out["winner"] = {"throughput": names[thr_winner], "time_to_level": names[lvl_winner]}
    return out


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    spec = SIZES[size]
    result = new_result(STUDY, size, {"preset": "tiny-cpu.toml", "arms": {k: list(v) for k, v in ARMS.items()},
                                      "common_overrides": [*COMMON, *spec["overrides"]], "seeds": spec["seeds"],
                                      "reward_level": REWARD_LEVEL, "window": WINDOW})
    runs: dict[str, dict[int, RunSummary]] = {arm: {} for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp, ray_session():
        for seed in spec["seeds"]:
            for arm, overrides in ARMS.items():
                ov = [*COMMON, *spec["overrides"], f"trainer.seed={seed}", f"data.seed={seed}", *overrides]
                runs[arm][seed] = launch(PRESETS / "tiny-cpu.toml", ov, Path(tmp), f"{arm}-s{seed}")
    c = compare(runs)
    result["runs"] = {arm: {str(s): r.to_json() for s, r in by_seed.items()} for arm, by_seed in runs.items()}
    result["comparison"] = c
    result["tables"] = _tables(runs, c)
    result["notes"] = [
        "Throughput: trained prompts/s over steps 2…K on the trainer's clock (`asyncrl/time`). Time to level: "
        f"the trainer-clock time of the first step whose {WINDOW}-step moving mean reward reaches {REWARD_LEVEL}.",
        "Ratios are per seed (the arm against the sync run of the same seed); a winner between `async` and "
        "`elastic` is named only when every seed's ratio of one lies beyond the other's whole range.",
        "Validation is off (`trainer.test_freq=0`) so every arm times the same work.",
    ]
    return publish(result, started, out_dir, lambda: plot(runs, out_dir))


def _fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['mean']:.{digits}g} ± {s['sd']:.2g} ({s['min']:.{digits}g}…{s['max']:.{digits}g})"


def _tables(runs: dict[str, dict[int, RunSummary]], c: dict[str, Any]) -> list[dict[str, Any]]:
    per_run = []
    for arm, by_seed in runs.items():
        for s, r in sorted(by_seed.items()):
            ttl = time_to_level(r.curve)
            per_run.append([arm, s, r.steps, round(r.prompts_per_s, 1), round(r.median_step_s, 3),
                            round(r.t_gen, 2), round(r.t_train, 2), round(r.wall_s, 1),
                            f"{r.final_reward:.3f}", "never" if ttl is None else round(ttl, 1)])
    arms = [[arm, _fmt(a["prompts_per_s"]), _fmt(a["median_step_s"]), _fmt(a["final_reward"])]
            for arm, a in c["arms"].items()]
    ratios = []
    for arm, r in c["ratios"].items():
        thr, lvl = r["throughput"], r["time_to_level"]
        ratios.append([f"{arm} ÷ sync", _fmt(spread(thr)), ", ".join(f"{x:.3f}" for x in thr),
                       _fmt(spread(lvl)) if lvl else "n/a", ", ".join(f"{x:.3f}" for x in lvl)])
    winner = [["throughput", c["winner"]["throughput"]], ["time to reward level", c["winner"]["time_to_level"]]]
    return [
        table("Runs", ["arm", "seed", "steps", "prompts/s (steps 2…K)", "median step (s)", "T_gen (s)",
                       "T_train (s)", "end-to-end wall (s)", "final reward", f"time to reward {REWARD_LEVEL} (s)"],
              per_run),
        table("Per arm (mean ± sd (min…max) over seeds)", ["arm", "prompts/s", "median step (s)", "final reward"],
              arms),
        table("Ratios against sync (per seed)", ["ratio", "throughput", "per seed", "time to reward level",
                                                 "per seed"], ratios),
        table("Winner (elastic vs async, beyond the spread)", ["measure", "winner"], winner),
    ]


def plot(runs: dict[str, dict[int, RunSummary]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(1, 1, figsize=(7, 4))
    colors = {"sync": "tab:blue", "async": "tab:orange", "elastic": "tab:green"}
    for arm, by_seed in runs.items():
        for i, (s, r) in enumerate(sorted(by_seed.items())):
            ax.plot(r.curve["time"], r.curve["reward"], color=colors[arm], alpha=0.6, lw=1,
                    label=arm if i == 0 else None)
    ax.set(xlabel="trainer wall time (s)", ylabel="mean reward", title="tiny: reward vs time, per arm and seed")
    ax.legend(fontsize=8)
    return save(fig, out_dir, STUDY)
