"""`report.md` (and `validation.png`): what a user reads in the run directory after a run.

Written by the driver when a run ends — finished, stopped or failed — from the files the run wrote, and nothing
else: `config.resolved.json` (the settings), `machine.json` (what `"auto"` chose and the ratios it measured),
`metrics.jsonl` (one record per trainer step), `events.jsonl` (syncs, errors, the final weights),
`ledger.jsonl` (what became of every prompt) and `run.json` (the run's identity). It can be rewritten at any
time from those (`write_report(run_dir, exit_code)`), so it is a view of the run, never a second record of it.

The numbers in it:
- reward: the mean of `critic/rewards/mean` over the first and the last tenth of the steps (at least one step),
  so one noisy step does not decide the headline;
- step, update and generation times: medians of `timing_s/step`, `timing_s/update_actor`, `timing_s/gen`;
- throughput: medians of `asyncrl/trainer/tokens_per_s` and `asyncrl/rollout/tokens_per_s`;
- syncs: the count of `sync` events, how many the delivery check verified, the median pause and transfer;
- the ledger: the last status of each prompt uid (a prompt re-queued after a fault keeps its final status).

The plot needs matplotlib (the `bench` extra, which `make install` brings); without it the report says so and
keeps the table. Standard library otherwise; no Ray, no torch.
"""

from __future__ import annotations

import json
import platform
import statistics
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.telemetry.val_curve import ValPoint, format_validation_curve, validation_curve

REPORT_FILE = "report.md"
PLOT_FILE = "validation.png"
_PACKAGES = ("asyncrl", "torch", "transformers", "ray", "vllm", "megatron-core")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file that parses as an object (a torn last line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _numbers(records: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in records
            if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, unit: str = "") -> str:
    """Three significant digits; seconds under one as milliseconds, large counts with thousands separators."""
    if value is None:
        return "–"
    if unit == " s" and abs(value) < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:.3g}{unit}"


def reward_change(rewards: list[float]) -> tuple[float, float] | None:
    """(mean of the first tenth, mean of the last tenth) of the per-step rewards; None without two steps."""
    if len(rewards) < 2:
        return None
    k = max(1, len(rewards) // 10)
    return statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:])


def ledger_counts(ledger: list[dict[str, Any]]) -> Counter[str]:
    """How many prompts ended in each status (the last line of a uid wins)."""
    last: dict[Any, str] = {}
    for rec in ledger:
        if "uid" in rec:
            last[rec["uid"]] = str(rec.get("status", "?"))
    return Counter(last.values())


def _verified(value: Any) -> bool:
    """A sync event's delivery check passed: every replica that reported loaded what was sent (the fraction 1.0;
    older runs wrote `true`)."""
    return value is True or (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1.0)


def _versions() -> list[str]:
    found = []
    for name in _PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return [f"python {platform.python_version()}", *found, f"{platform.system()} {platform.machine()}"]


def _settings(cfg: dict[str, Any]) -> list[tuple[str, Any]]:
    """The settings a reader asks about first, as `key = value` rows from the resolved config."""
    def get(path: str) -> Any:
        node: Any = cfg
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    keys = ("model.path", "data.train_files", "async_training.mode", "async_training.trigger_parameter_sync_step",
            "async_training.staleness_threshold", "async_training.partial_rollout", "rollout.backend",
            "rollout.n", "rollout.replicas", "rollout.dtype", "rollout.weight_sync", "trainer.backend",
            "trainer.precision", "trainer.optim.lr", "trainer.ppo_mini_batch_size", "trainer.total_steps",
            "algorithm.adv_estimator", "algorithm.rollout_correction.preset",
            "algorithm.rollout_correction.bypass_mode", "resources.trainer.cpu_threads")
    return [(k, get(k)) for k in keys if get(k) is not None]


def _plot(points: list[ValPoint], out: Path) -> str | None:
    """Draw accuracy against wall time (version on the labels); the reason when it cannot."""
    timed = [p for p in points if p.time_s is not None]
    if not timed:
        return "no timed validation to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'asyncrl[bench]' draws it)"
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for src in sorted({s for p in timed for s in p.accuracy}):
        pts = [p for p in timed if src in p.accuracy]
        ax.plot([p.time_s / 60 for p in pts], [p.accuracy[src] for p in pts], marker="o", label=src)
        for p in pts:
            ax.annotate(f"v{p.version}", (p.time_s / 60, p.accuracy[src]), fontsize=7,
                        textcoords="offset points", xytext=(0, 5))
    ax.set_xlabel("minutes since launch")
    ax.set_ylabel("validation accuracy (val-core)")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return None


def render_report(run_dir: Path, exit_code: int, plot_note: str | None) -> str:
    """The markdown text of `report.md` for `run_dir` (pure over the run's files)."""
    cfg = _json(run_dir / "config.resolved.json")
    ident = _json(run_dir / "run.json")
    machine = _json(run_dir / "machine.json")
    metrics = _jsonl(run_dir / "metrics.jsonl")
    events = _jsonl(run_dir / "events.jsonl")
    steps = [r for r in metrics if "timing_s/step" in r]  # trainer steps (validation records have no step time)
    points = validation_curve(run_dir / "metrics.jsonl")
    errors = [e for e in events if e.get("level") == "error"]
    outcome = "finished" if exit_code == 0 else f"failed (exit {exit_code})"
    lines = [f"# Run report: {cfg.get('name', run_dir.name)}", "",
             f"- run id: `{ident.get('id', '?')}`, directory `{run_dir}`"
             + (f", resumed from `{ident['resumed_from']}`" if ident.get("resumed_from") else ""),
             f"- outcome: **{outcome}**" + (f" — {errors[-1].get('message', '')}" if errors and exit_code else "")]
    times = _numbers(steps, "asyncrl/time")
    if times:
        lines.append(f"- trained {len(steps)} steps in {times[-1] / 60:.1f} min "
                     f"(to version {steps[-1].get('fully_async/count/current_param_version', '?')})")
    sha = [e["weights_sha256"] for e in events if e.get("kind") == "weights" and e.get("weights_sha256")]
    if sha:
        lines.append(f"- final weights sha256 `{sha[-1]}`")
    lines += ["", "## Validation", ""]
    if points:
        lines += [f"![validation accuracy]({PLOT_FILE})" if plot_note is None else f"(no plot: {plot_note})", "",
                  "```text", format_validation_curve(points), "```"]
    else:
        lines.append("No validation ran.")
    lines += ["", "## Training", "", "| what | value |", "|---|---|"]
    change = reward_change(_numbers(steps, "critic/rewards/mean"))
    if change:
        lines.append(f"| reward (first → last tenth of the steps) | {change[0]:.3f} → {change[1]:.3f} |")
    for label, key, unit in (("step time (median)", "timing_s/step", " s"),
                             ("update time (median)", "timing_s/update_actor", " s"),
                             ("generation time (median)", "timing_s/gen", " s"),
                             ("trainer tokens/s (median)", "asyncrl/trainer/tokens_per_s", ""),
                             ("rollout tokens/s (median)", "asyncrl/rollout/tokens_per_s", ""),
                             ("staleness (mean over steps)", "asyncrl/staleness/mean", "")):
        values = _numbers(steps, key)
        if values:
            value = statistics.fmean(values) if "mean over" in label else _median(values)
            lines.append(f"| {label} | {_fmt(value, unit)} |")
    syncs = [e for e in events if e.get("kind") == "sync"]
    if syncs:
        verified = sum(1 for e in syncs if _verified(e.get("verified")))
        lines.append(f"| weight syncs | {len(syncs)} ({verified} verified), pause "
                     f"{_fmt(_median(_numbers(syncs, 'pause_s')), ' s')}, transfer "
                     f"{_fmt(_median(_numbers(syncs, 'transfer_s')), ' s')} (medians) |")
    counts = ledger_counts(_jsonl(run_dir / "ledger.jsonl"))
    if counts:
        lines.append("| prompts (ledger) | " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + " |")
    lines += ["", "## Settings", "", "| key | value |", "|---|---|"]
    lines += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in _settings(cfg)]
    chosen = [c for c in machine.get("choices") or [] if isinstance(c, dict) and "key" in c]
    if chosen:
        cpu = (machine.get("machine") or {}).get("cpu", "this machine")
        lines += ["", f"Chosen on {cpu} (`\"auto\"`, from `machine.json`):", ""]
        lines += [f"- `{c['key']}` → `{c.get('value')}`: {c.get('why', '')}" for c in chosen]
    lines += ["", "## Versions", "", "; ".join(_versions()), ""]
    return "\n".join(lines)


def write_report(run_dir: str | Path, exit_code: int) -> Path:
    """Write `report.md` (and `validation.png` where it can) into `run_dir`; returns the report's path."""
    run_dir = Path(run_dir)
    points = validation_curve(run_dir / "metrics.jsonl")
    note = _plot(points, run_dir / PLOT_FILE) if points else "no validation"
    path = run_dir / REPORT_FILE
    path.write_text(render_report(run_dir, exit_code, note), encoding="utf-8")
    return path
