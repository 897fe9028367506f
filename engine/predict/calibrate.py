"""Calibrate the plan's cost model on a measured run: read its `metrics.jsonl` and write `calibration.json`.

Per trainer step the runtime records `timing_s/step` (the whole step), `timing_s/gen` (the wait for data),
`timing_s/param_sync` (on steps that synced: export + pause + transfer), `asyncrl/sync/pause_s`, and per
version the rollouter's `fully_async/rollouter/active_time` (Σ over replicas of the time a dispatch ran).

    trainer busy of a step  = step − gen − param_sync                      (the sync is accounted separately)
                            ≈ o + c · tokens,  tokens = response_length/mean · required_samples · n
                              (least squares when the token count varies by > 15 %; else c = 0, o = mean)
    sync                    = mean(param_sync − pause)                     (the pause is simulated: aborts)
    keep rate (dynamic sampling) = trained / (trained + Δ asyncrl/count/filtered_groups) over the steps,
                              trained = steps · required_samples
    responses               = long_tail = mean clip_ratio; short ones uniform on 1..S with
                              (S + 1) / 2 = (mean − tail · max) / (1 − tail)
    decode step a           : the simulated Σ replica busy per version is proportional to a when the rest
                              is fixed; a ← a · measured / simulated, three times (a fixed point)

The first `skip` steps (start-up, first compilations) are left out. Everything measured is kept under
`measured` so a plan can be compared with the run it came from.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from engine.predict.costs import CostModel, Layout

SKIP = 3


class CalibrationError(ValueError):
    """The run directory does not hold what a calibration needs."""


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer-step rows of `run_dir/metrics.jsonl` (those with `timing_s/step`), in order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise CalibrationError(f"{run_dir}: no metrics.jsonl (is this a run directory?)")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a run still going
        if isinstance(row, dict) and isinstance(row.get("timing_s/step"), (int, float)):
            rows.append(row)
    return rows


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def measured(rows: list[dict[str, Any]], layout: Layout, skip: int = SKIP) -> dict[str, Any]:
    """What the run measured over its steps after `skip`: step time, samples/s, idle ratios, sync pause."""
    rows = rows[skip:] if len(rows) > skip + 2 else rows
    if len(rows) < 2:
        raise CalibrationError(f"only {len(rows)} trainer steps recorded; a calibration needs at least 3")
    times = [r["asyncrl/time"] for r in rows if isinstance(r.get("asyncrl/time"), (int, float))]
    span = times[-1] - times[0] if len(times) >= 2 else sum(r["timing_s/step"] for r in rows[1:])
    steps = len(rows) - 1
    syncs = [r for r in rows if "timing_s/param_sync" in r]
    filtered = [r["asyncrl/count/filtered_groups"] for r in rows if "asyncrl/count/filtered_groups" in r]
    trained = steps * layout.required_samples
    keep = trained / (trained + filtered[-1] - filtered[0]) if len(filtered) >= 2 and trained > 0 else None
    return {
        "steps": steps,
        "step_time_s": span / steps,
        "samples_per_s": steps * layout.required_samples / span if span > 0 else None,
        "trainer_idle_ratio": _mean([r["fully_async/trainer/idle_ratio"] for r in rows
                                     if "fully_async/trainer/idle_ratio" in r]),
        "rollout_idle_ratio": _mean([r["fully_async/rollouter/idle_ratio"] for r in syncs
                                     if "fully_async/rollouter/idle_ratio" in r]),
        "sync_pause_s": _mean([r["timing_s/param_sync"] for r in syncs]),
        "response_length_mean": _mean([r["response_length/mean"] for r in rows if "response_length/mean" in r]),
        "max_staleness": max((int(r.get("asyncrl/staleness/max", 0)) for r in rows), default=0),
        "keep_rate": keep,
    }


def _fit_train(rows: list[dict[str, Any]], layout: Layout) -> tuple[float, float, str]:
    """(per-token, per-step) trainer cost and how it was fitted."""
    busy, tokens = [], []
    for r in rows:
        b = r["timing_s/step"] - r.get("timing_s/gen", 0.0) - r.get("timing_s/param_sync", 0.0)
        busy.append(max(0.0, b))
        tokens.append(r.get("response_length/mean", 0.0) * layout.required_samples * layout.n)
    mt = statistics.fmean(tokens)
    if mt > 0 and len(rows) >= 5 and statistics.pstdev(tokens) / mt > 0.15:
        mb = statistics.fmean(busy)
        var = sum((t - mt) ** 2 for t in tokens)
        c = sum((t - mt) * (b - mb) for t, b in zip(tokens, busy)) / var
        if c > 0 and mb - c * mt >= 0:
            return c, mb - c * mt, "least squares over steps: busy = o + c · tokens"
    return 0.0, statistics.fmean(busy), "a constant per step (the token count hardly varied)"


def calibrate(run_dir: Path, layout: Layout, skip: int = SKIP) -> dict[str, Any]:
    """The calibration of `run_dir` (whose config gave `layout`); raises CalibrationError."""
    from engine.predict.prediction import simulate

    all_rows = read_rows(run_dir)
    m = measured(all_rows, layout, skip)
    rows = all_rows[skip:] if len(all_rows) > skip + 2 else all_rows
    c, o, how = _fit_train(rows, layout)
    syncs = [r for r in rows if "timing_s/param_sync" in r]
    sync_s = _mean([max(0.0, r["timing_s/param_sync"] - r.get("asyncrl/sync/pause_s", 0.0)) for r in syncs]) or 0.0
    active = _mean([r["fully_async/rollouter/active_time"] for r in syncs
                    if "fully_async/rollouter/active_time" in r])
    if not active:
        raise CalibrationError(f"{run_dir}: no fully_async/rollouter/active_time recorded (no sync happened?)")
    M = layout.max_new_tokens
    tail = min(1.0, max(0.0, _mean([r.get("response_length/clip_ratio", 0.0) for r in rows]) or 0.0))
    mean_len = m["response_length_mean"] or M / 2
    short_mean = (mean_len - tail * M) / (1 - tail) if tail < 0.999 else M
    short_max = int(min(M, max(1, round(2 * short_mean - 1))))
    per_version = active  # active_time is recorded per version (at each sync)
    a = per_version / max(1.0, layout.max_new_tokens * layout.required_samples * layout.trigger)
    probe = dataclasses.replace(layout, device="cuda", total_versions=None)
    keep = m["keep_rate"] if layout.loop.dynamic_sampling and m["keep_rate"] else None
    for _ in range(3):
        cm = CostModel(a, 0.0, 0.0, c, o, layout.trainer_world, sync_s, tail, short_max, keep_rate=keep or 1.0)
        p = simulate(probe, cm, "calibration", measure=4)
        sim_active = (1 - p.rollout_idle_ratio) * layout.replicas * p.version_time_s
        if sim_active <= 0:
            break
        a *= per_version / sim_active
    return {
        "schema": "asyncrl.calibration/1",
        "run_dir": str(run_dir),
        "run": layout.name,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reference": dataclasses.asdict(layout),
        "costs": {"decode_step_s": a, "row_step_s": 0.0, "prefill_token_s": 0.0, "train_token_s": c,
                  "train_step_s": o, "train_world": layout.trainer_world, "sync_s": sync_s,
                  "long_tail": tail, "short_max": short_max, "keep_rate": keep},
        "measured": m,
        "notes": [f"calibrated on {run_dir} ({m['steps']} steps after the first {skip}): trainer cost {how}; "
                  "decode cost per step at the measured batch (no split into per-row and fixed parts from one "
                  "operating point); prefill folded into it"],
    }


def write(run_dir: Path, calibration: dict[str, Any]) -> Path:
    """Write `run_dir/calibration.json`; returns its path."""
    path = run_dir / "calibration.json"
    path.write_text(json.dumps(calibration, indent=2) + "\n", encoding="utf-8")
    return path
