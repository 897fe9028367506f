"""Study 4 — trainer throughput: tokens/s of one GRPO update (`train_step`) of the `torch` and `megatron`
backends on CPU, at the presets' batch shapes (tiny: 32 prompts × 8 × 4 response tokens; SmolLM2: 4 prompts
× 8 × 40). Each (backend, preset) is measured in its own process by `benchmarks.trainer_worker`; a backend
that cannot be built (e.g. Megatron unavailable) gets a row saying why instead of numbers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    PRESETS,
    new_result,
    publish,
    python_exe,
    run_json_subprocess,
    table,
)
from benchmarks.plots import pyplot, save

STUDY = "trainer-throughput"
BACKENDS = ("torch", "megatron")
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "presets": {"tiny": ("tiny-cpu.toml", []), "smollm2": ("smollm2-arith-cpu.toml", [])},
        "steps": 3,
        "threads": 1,
    },
    "toy": {
        "presets": {
            "tiny": (
                "tiny-cpu.toml",
                ["trainer.ppo_mini_batch_size=4", "rollout.n=4", "trainer.ppo_micro_batch_size_per_gpu=16"],
            )
        },
        "steps": 1,
        "threads": 1,
    },
}


def measure(preset: str, overrides: list[str], backend: str, steps: int, threads: int) -> dict[str, Any]:
    argv = [
        python_exe(),
        "-m",
        "benchmarks.trainer_worker",
        str(PRESETS / preset),
        "--backend",
        backend,
        "--steps",
        str(steps),
        "--threads",
        str(threads),
    ]
    for o in overrides:
        argv += ["--set", o]
    return run_json_subprocess(argv, threads, timeout_s=1800)


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    spec = SIZES[size]
    threads = spec["threads"] or (os.cpu_count() or 1)
    result = new_result(STUDY, size, {**spec, "threads": threads, "backends": list(BACKENDS)})
    rows = []
    for name, (preset, overrides) in spec["presets"].items():
        for backend in BACKENDS:
            out = measure(preset, overrides, backend, spec["steps"], threads)
            rows.append({"preset": name, **out, "backend": backend})
    result["rows"] = rows
    result["tables"] = [
        table(
            f"GRPO update throughput on CPU ({threads} thread(s), median of {spec['steps']} steps after a warm-up)",
            [
                "preset",
                "backend",
                "rows",
                "tokens",
                "step (s)",
                "update tokens/s",
                "log-prob tokens/s",
                "note",
            ],
            [
                [
                    r["preset"],
                    r["backend"],
                    r.get("rows", ""),
                    r.get("tokens", ""),
                    round(r["step_s"], 3) if "step_s" in r else "",
                    round(r["tokens_per_s"], 1) if "tokens_per_s" in r else "",
                    round(r["logprob_tokens_per_s"], 1) if "logprob_tokens_per_s" in r else "",
                    f"skipped: {r['error']}" if "error" in r else "",
                ]
                for r in rows
            ],
        )
    ]
    result["notes"] = [
        (
            f"{threads} intra-op thread(s): what the trainer gets in fully async mode on a 2-core machine "
            "(`engine/runtime/driver.py::_placement`). With 2 threads on this shared machine the same step "
            "took 0.26–8 s instead of 0.15 s (OpenMP threads waiting on a descheduled peer)."
        ),
        (
            "Tokens are prompt + response tokens of the batch (Σ attention_mask), the same definition as the "
            "engine's `asyncrl/trainer/tokens_per_s`; responses are full-length random tokens with rewards "
            "alternating 1/0 within each group, so no row is dropped for a zero advantage."
        ),
        "Both backends run fp32 on CPU with the preset's micro-batch size, gradient clipping and AdamW.",
    ]
    result["notes"] += [
        f"{r['backend']} on {r['preset']} skipped: {r['error']}" for r in rows if "error" in r
    ]
    return publish(result, started, out_dir, lambda: plot(rows, out_dir))


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(5.5 * len(presets), 3.8), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        mine = [r for r in rows if r["preset"] == preset]
        values = [r.get("tokens_per_s", 0.0) for r in mine]
        drawn = ax.bar([r["backend"] for r in mine], values, color=["tab:blue", "tab:purple"][: len(mine)])
        for rect, r in zip(drawn, mine):
            text = f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else "skipped"
            ax.annotate(
                text,
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set(ylabel="tokens / s (GRPO update)", title=f"{preset}: trainer throughput")
        ax.title.set_fontsize(10)
    return save(fig, out_dir, STUDY)
