"""Study 18 — packed rows (`trainer.use_remove_padding`, `engine.trainer.packed_rows`): the padding the demo's
batches carry, and what removing it saves per update.

Each seed is one demo batch as the rollout makes it (`benchmarks.packing_worker`: 4 arith prompts × 8 responses
sampled from SmolLM2-135M-Instruct at its initial weights, so the response lengths — and the padding — are the
model's own), trained in one fresh worker process by four arms, one after the other on the same batch:

    shared+packed   shared_prompt = true,  use_remove_padding = true    (the demo now: the packing with fewer
                                                                         tokens runs)
    shared          shared_prompt = true,  use_remove_padding = false   (the demo before packing)
    packed          shared_prompt = false, use_remove_padding = true    (rows without padding, first-fit sequences)
    padded          shared_prompt = false, use_remove_padding = false   (every row padded to the longest)

Every arm's tokens are counted (the trainer's own packing decision on its own micro-batches); the update is timed
for the arms not listed `untimed` — the full size leaves out `shared`, whose forward is, on these batches,
shared+packed's (the same tokens: the shared prompt wins the choice), and times 3 updates per arm in every seed,
the seeds one after the other (a size may set `timed_seeds` and `parallel` to fit a busy machine); the arms of one
seed run back to back, so speedups are read within a seed.

Per arm: the tokens of one update — real Σℓ, padded Σ B_k·W_k (the arm's micro-batches, each padded to its own
longest row), and forwarded (what the forward ran on) — the micro-batches, and the median update seconds after a
warm-up update. The precision and attention (trainer and sampling) are pinned to what the demo's `auto` chose on the machine the
shared-prompt study ran on (bf16 autocast, eager), the trainer on 2 threads, as in the demo.

    padding removed = 1 − forwarded ÷ padded        speedup = padded arm's update seconds ÷ the arm's
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, new_result, publish, python_exe, run_json_subprocess, table
from benchmarks.plots import pyplot, save

STUDY = "packing"
ARMS = {
    "shared+packed": ["trainer.shared_prompt=true", "trainer.use_remove_padding=true"],
    "shared": ["trainer.shared_prompt=true", "trainer.use_remove_padding=false"],
    "packed": ["trainer.shared_prompt=false", "trainer.use_remove_padding=true"],
    "padded": ["trainer.shared_prompt=false", "trainer.use_remove_padding=false"],
}
SIZES: dict[str, dict[str, Any]] = {
    "full": {"preset": "smollm2-arith-cpu.toml", "seeds": [0, 1, 2], "steps": 3, "threads": 2, "untimed": ["shared"],
             "overrides": ['trainer.precision="bf16"', 'trainer.attn_implementation="eager"', 'rollout.dtype="bf16"']},
    "toy": {"preset": "tiny-cpu.toml", "seeds": [0], "steps": 1, "threads": 1, "untimed": ["shared"],
            "overrides": ["trainer.ppo_mini_batch_size=2", "rollout.n=4", "trainer.ppo_micro_batch_size_per_gpu=8",
                         'trainer.attn_implementation="eager"']},
}


def measure_seed(spec: dict[str, Any], seed: int) -> dict[str, Any]:
    steps = spec["steps"] if seed in spec.get("timed_seeds", spec["seeds"]) else 0
    argv = [python_exe(), "-m", "benchmarks.packing_worker", str(PRESETS / spec["preset"]), "--seed", str(seed),
            "--steps", str(steps), "--threads", str(spec["threads"])]
    for o in spec["overrides"]:
        argv += ["--set", o]
    for arm, extra in ARMS.items():
        argv += ["--arm", f"{arm}={';'.join(extra)}"]
    for arm in spec.get("untimed", []):
        argv += ["--untimed", arm]
    out = run_json_subprocess(argv, spec["threads"], timeout_s=3600)
    print(f"seed {seed}: {out}", flush=True)  # progress, in case the study is cut short
    return out


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    spec = SIZES[size]
    result = new_result(STUDY, size, {**spec, "arms": ARMS})
    with ThreadPoolExecutor(max_workers=len(spec["seeds"]) if spec.get("parallel") else 1) as pool:
        seeds = [{"seed": s, **out} for s, out in zip(spec["seeds"], pool.map(lambda s: measure_seed(spec, s),
                                                                                spec["seeds"]))]
    result["seeds"] = seeds
    if all("error" in s for s in seeds):
        raise RuntimeError(f"packing: every seed failed; the first: {seeds[0]['error']}")
    rows = [{"seed": s["seed"], "arm": arm, **m} for s in seeds for arm, m in s.get("arms", {}).items()]
    result["rows"] = rows
    base = {r["seed"]: r for r in rows if r["arm"] == "padded" and "step_s" in r}
    summary: dict[str, Any] = {}
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        summary[arm] = {
            "forwarded_tokens": [r["forwarded_tokens"] for r in mine],
            "padding_removed": [1 - r["forwarded_tokens"] / base[r["seed"]]["padded_tokens"] for r in mine
                                if r["seed"] in base],
            "step_s": [r["step_s"] for r in mine if "step_s" in r],
            "speedup": [base[r["seed"]]["step_s"] / r["step_s"] for r in mine if r["seed"] in base and "step_s" in r],
        }
    result["summary"] = summary
    result["tables"] = [
        table(f"Tokens of one update of {spec['preset']}'s batch (sampled responses), per seed and arm",
              ["seed", "arm", "rows", "real tokens", "padded tokens", "forwarded tokens", "padding removed",
               "micro-batches", "update (s)", "speedup", "grad norm", "note"],
              [[r["seed"], r["arm"], r.get("rows", ""), r.get("real_tokens", ""), r.get("padded_tokens", ""),
                r.get("forwarded_tokens", ""),
                f"{1 - r['forwarded_tokens'] / base[r['seed']]['padded_tokens']:.0%}" if r["seed"] in base else "",
                r.get("micro_batches", ""), round(r["step_s"], 2) if "step_s" in r else "not timed",
                round(base[r["seed"]]["step_s"] / r["step_s"], 2) if r["seed"] in base and "step_s" in r else "",
                round(r["grad_norm"], 3) if "grad_norm" in r else "", ""] for r in rows]
              + [[s["seed"], "", "", "", "", "", "", "", "", "", "", f"skipped: {s['error']}"]
                 for s in seeds if "error" in s]),
        table("Per arm over the seeds (median update seconds; tokens as mean)",
              ["arm", "forwarded tokens (mean)", "padding removed (mean)", "update s (median)",
               "speedup (median)"],
              [[arm, round(statistics.mean(v["forwarded_tokens"])),
                f"{statistics.mean(v['padding_removed']):.0%}" if v["padding_removed"] else "",
                round(statistics.median(v["step_s"]), 2) if v["step_s"] else "not timed",
                round(statistics.median(v["speedup"]), 2) if v["speedup"] else ""] for arm, v in summary.items()]),
    ]
    result["targets"] = []
    result["notes"] = [
        "'padded tokens' = Σ over the arm's micro-batches of rows × longest row (what the padded forward runs on); "
        "'forwarded' = what the arm's forward ran on (padded ÷ `asyncrl/trainer/shared_prompt_saving`); "
        "'padding removed' = 1 − forwarded ÷ the padded arm's padded tokens.",
        f"precision and attention pinned: {', '.join(spec['overrides'])}; {spec['threads']} thread(s).",
    ]
    return publish(result, started, out_dir, lambda: plot(rows, out_dir))


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    arms = list(ARMS)
    for i, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm and "step_s" in r]
        ax.scatter([r["forwarded_tokens"] for r in mine], [r["step_s"] for r in mine], label=arm, marker="os^D"[i])
    ax.set(xlabel="tokens forwarded per update", ylabel="update seconds", title="packed rows on the demo's batches")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    return save(fig, out_dir, STUDY)
