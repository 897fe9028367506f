"""Study 6 — staleness vs speed (verl's ablation): the async-vs-sync comparison repeated for
`staleness_threshold` ∈ {0, 0.1, 0.5} × `partial_rollout` ∈ {off, on} on the tiny preset, against one sync
baseline. Per configuration: trained prompts/s, speedup over sync, final reward, mean/max staleness of the
trained samples and the share of partial (resumed) trajectories.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, new_result, publish, sig, table
from benchmarks.engine_runs import SYNC_OVERRIDES, RunSummary, launch, ray_session
from benchmarks.plots import bars, pyplot, save

STUDY = "staleness"
PRESET = "tiny-cpu.toml"
COMMON = ("trainer.test_freq=0", "trainer.val_before_train=false")
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "overrides": ["rollout.total_rollout_steps=3200"],
        "grid": [(s, p) for s in (0.0, 0.1, 0.5) for p in (False, True)],
        "baseline": True,
    },
    # the toy skips the sync baseline (each engine run costs ~10 s of actor start-up; async-vs-sync's toy
    # covers the sync path), so its speedup column is empty
    "toy": {
        "overrides": [
            "trainer.ppo_mini_batch_size=4",
            "trainer.ppo_micro_batch_size_per_gpu=16",
            "rollout.n=4",
            "rollout.total_rollout_steps=8",
        ],
        "grid": [(0.5, True)],
        "baseline": False,
    },
}


def label(staleness: float, partial: bool) -> str:
    return f"s={staleness:g} partial={'on' if partial else 'off'}"


def async_overrides(staleness: float, partial: bool) -> list[str]:
    return [
        'async_training.mode="fully_async"',
        f"async_training.staleness_threshold={staleness}",
        f"async_training.partial_rollout={'true' if partial else 'false'}",
    ]


def row_of(name: str, s: RunSummary, sync: RunSummary | None) -> dict[str, Any]:
    """One table row; `speedup` = this run's steady prompts/s ÷ the sync run's (None without a baseline)."""
    speedup = s.prompts_per_s / sync.prompts_per_s if sync is not None else None
    return {"config": name, "speedup": speedup, **s.to_json()}


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    spec = SIZES[size]
    result = new_result(
        STUDY,
        size,
        {
            "preset": PRESET,
            "overrides": [*COMMON, *spec["overrides"]],
            "grid": [list(g) for g in spec["grid"]],
        },
    )
    base = [*COMMON, *spec["overrides"]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp, ray_session():
        sync = None
        if spec["baseline"]:
            sync = launch(PRESETS / PRESET, [*base, *SYNC_OVERRIDES], Path(tmp), "sync")
            rows.append(row_of("sync", sync, sync))
        for staleness, partial in spec["grid"]:
            tag = f"s{staleness:g}-p{int(partial)}"
            summary = launch(PRESETS / PRESET, [*base, *async_overrides(staleness, partial)], Path(tmp), tag)
            rows.append(row_of(label(staleness, partial), summary, sync))
    result["rows"] = rows
    result["tables"] = [
        table(
            "Staleness × partial rollout (tiny preset)",
            [
                "config",
                "prompts/s",
                "async ÷ sync",
                "final reward",
                "staleness mean",
                "staleness max",
                "partial ratio",
                "train wall (s)",
            ],
            [
                [
                    r["config"],
                    sig(r["prompts_per_s"]),
                    "" if r["speedup"] is None else round(r["speedup"], 2),
                    f"{r['final_reward']:.3f} ± {r['final_reward_se']:.3f}",
                    round(r["staleness_mean"], 2),
                    int(r["staleness_max"]),
                    round(r["partial_ratio"], 3),
                    round(r["train_wall_s"], 2),
                ]
                for r in rows
            ],
        )
    ]
    result["notes"] = [
        (
            "Same preset, same number of trained prompts, same cores; only `staleness_threshold` and "
            "`partial_rollout` change (verl's ablation). The sync row is the baseline of the speedup column."
        ),
        (
            "Staleness is `trainer_version − min_version` of the trained trajectories; the partial ratio is the "
            "share of trajectories resumed across a weight sync."
        ),
    ]
    return publish(result, started, out_dir, lambda: plot(rows, out_dir))


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    colors = [
        "tab:blue" if r["config"] == "sync" else ("tab:orange" if r["config"].endswith("on") else "tab:green")
        for r in rows
    ]
    speedup = all(r["speedup"] is not None for r in rows)  # else (no sync row) the raw throughput
    bars(
        left,
        [r["config"] for r in rows],
        [r["speedup"] if speedup else r["prompts_per_s"] for r in rows],
        ylabel="speedup over sync (×)" if speedup else "trained prompts / s",
        title=f"{'speedup' if speedup else 'throughput'} by staleness_threshold / partial_rollout",
        colors=colors,
        hline=1.6 if speedup else None,
        hline_label="target 1.6×" if speedup else "",
    )
    for r in rows:
        right.plot(
            r["curve"]["time"],
            r["curve"]["reward"],
            label=r["config"],
            linewidth=2 if r["config"] == "sync" else 1,
        )
    right.set(xlabel="trainer wall time (s)", ylabel="mean reward", title="reward vs wall time")
    right.title.set_fontsize(10)
    right.legend(fontsize=7)
    return save(fig, out_dir, STUDY)
