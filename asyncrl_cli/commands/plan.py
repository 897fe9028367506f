"""`asyncrl plan RUN.toml`: predict a layout's step time, idle ratios, staleness and async ÷ sync before
launching it, by running the loop's real cores in the costed simulator (engine/plan, pure Python).

`--calibrate RUN_DIR` reads a measured run (metrics.jsonl, config.resolved.json) and writes
`RUN_DIR/calibration.json`; `--calibration FILE` makes a plan use it (figures it lacks come from the
model's config.json and the hardware preset, with the efficiency factors printed). `--sweep` tries a grid.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from asyncrl_cli.commands._common import JsonOpt, SetOpt, analyze
from asyncrl_cli.errors import AsyncrlError, InvalidConfig, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

if TYPE_CHECKING:
    from engine.predict.costs import CostModel, Layout


def _hours(s: float | None) -> str:
    if s is None:
        return "unknown (total steps not derivable)"
    if s < 120:
        return f"{s:.1f} s"
    h, rest = divmod(int(s), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def _layout_of_run_dir(run_dir: Path) -> Layout:
    from pydantic import ValidationError

    from engine.config.schema import RunConfig
    from engine.predict.costs import Layout

    path = run_dir / "config.resolved.json"
    if not path.is_file():
        raise UsageProblem(f"{run_dir}: no config.resolved.json (is this a run directory?)",
                           "pass the directory a run wrote, e.g. runs/tiny-cpu-sync")
    try:
        cfg = RunConfig.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValidationError) as e:
        raise InvalidConfig(f"{path}: not a valid resolved config ({str(e).splitlines()[0]})") from None
    from engine.plan.hardware import HardwareNotFound, load_hardware

    try:
        device = load_hardware(cfg.resources.hardware).device
    except (HardwareNotFound, ValueError):
        device = "cuda"
    return Layout.from_config(cfg, None, device)


def _calibrate(run_dir: Path, as_json: bool, slots: int | None = None) -> None:
    from engine.predict.calibrate import CalibrationError, calibrate, write

    if not run_dir.is_dir():
        raise UsageProblem(f"run directory not found: {run_dir}")
    layout = _layout_of_run_dir(run_dir)
    if slots is not None:  # the decode cost is fitted under the slot model the plans will use
        import dataclasses

        layout = dataclasses.replace(layout, slots=slots)
    try:
        cal = calibrate(run_dir, layout)
    except CalibrationError as e:
        raise InvalidConfig(str(e)) from None
    path = write(run_dir, cal)
    if as_json:
        emit_json({"written": str(path), **cal})
        return
    c, m = cal["costs"], cal["measured"]
    typer.echo(f"wrote {path}")
    typer.echo(f"  decode step {c['decode_step_s'] * 1e3:.3f} ms · training {c['train_step_s']:.3f} s/step + "
               f"{c['train_token_s'] * 1e6:.3f} µs/token on {c['train_world']} rank(s) · sync {c['sync_s']:.3f} s · "
               f"responses: {c['long_tail']:.0%} to the limit, the rest 1..{c['short_max']}")
    typer.echo(f"  measured: {m['samples_per_s']:.2f} samples/s, step {m['step_time_s']:.3f} s, trainer idle "
               f"{m['trainer_idle_ratio']:.2f}, rollout idle {m['rollout_idle_ratio']:.2f}")


def _load_calibration(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    if not path.is_file():
        raise UsageProblem(f"calibration file not found: {path}", "write one with asyncrl plan --calibrate RUN_DIR")
    try:
        cal = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InvalidConfig(f"{path}: not JSON ({e})") from None
    if not isinstance(cal, dict):
        raise InvalidConfig(f"{path}: a calibration is a JSON object")
    return cal


def _setup(run_file: Path, sets: list[str] | None, cal_path: Path | None,
           keep_rate: float | None = None) -> tuple[Layout, CostModel]:
    from engine.predict.costs import CostsUnavailable, Layout, resolve

    an = analyze(run_file, sets)
    if an.config is None or an.exit_code == 1:
        first = next((p for p in an.problems if p.severity == "error"), None)
        raise InvalidConfig(f"{run_file}: invalid ({first.message if first else 'see asyncrl validate'})",
                            f"asyncrl validate {run_file}")
    device = an.hardware.device if an.hardware else "cuda"
    layout = Layout.from_config(an.config, an.derived.total_train_steps if an.derived else None, device)
    try:
        costs = resolve(layout, an.model, an.hardware, _load_calibration(cal_path),
                        str(cal_path) if cal_path else "calibration", keep_rate)
    except CostsUnavailable as e:
        raise AsyncrlError(str(e)) from None
    return layout, costs


def _row(p: Any) -> list[str]:
    hist = " ".join(f"{k}:{v}" for k, v in sorted(p.staleness_hist.items()))
    return [p.label, f"{p.rollout_world}:{p.trainer_world}" if p.label != "colocated" else f"{p.rollout_world}",
            f"{p.step_time_s:.3g} s", f"{p.samples_per_s:.3g}", f"{p.trainer_idle_ratio:.2f}",
            f"{p.rollout_idle_ratio:.2f}", hist, f"{p.sync_pause_s:.3g} s", _hours(p.time_to_end_s)]


def _render(layout: Layout, costs: CostModel, out: dict[str, Any], seconds: float) -> None:
    from rich.table import Table

    con = stdout_console()
    con.print(f"[bold]{layout.name}[/]: {layout.mode}, {layout.replicas} rollout replica(s) × "
              f"{layout.rollout_gpus or layout.rollout_tp} GPUs (tp {layout.rollout_tp})"
              f" ({layout.slots} dispatch slot(s) each) + {layout.trainer_world} trainer rank(s); {layout.required_samples} prompts × n={layout.n} per step, "
              f"trigger {layout.trigger}, staleness {layout.staleness:g}, responses ≤ {layout.max_new_tokens} tokens"
              + "".join(f"; {x}" for x in _loop_features(layout, costs)))
    t = Table(title="predicted (simulated steady state)", title_justify="left")
    for col in ("layout", "accel.", "step", "samples/s", "trainer idle", "rollout idle", "staleness: prompts",
                "sync pause/version", "to end"):
        t.add_column(col)
    for key in ("plan", "sync", "colocated"):
        if key in out:
            t.add_row(*_row(out[key]))
    con.print(t)
    parts = [f"async ÷ sync (same actors): {out['speedup_vs_sync']:.2f}×"] if "speedup_vs_sync" in out else []
    if "speedup_vs_colocated" in out:
        parts.append(f"÷ colocated ({layout.accelerators} accelerators in turn): {out['speedup_vs_colocated']:.2f}×")
    if parts:
        con.print(" · ".join(parts))
    if "lending" in out:
        lend = out["lending"]
        con.print(f"lending idle trainer devices to rollout (modelled, not built): {lend['predicted_gain']:.2f}× "
                  f"(trainer idle {lend['trainer_idle_ratio']:.2f}, {lend['lendable_replicas']} replica(s) worth of "
                  f"trainer devices; version {lend['version_time_s']:.3g} s → {lend['predicted_version_time_s']:.3g} s)")
    con.print("costs: " + ", ".join(f"{k} ← {v}" for k, v in sorted(costs.sources.items())))
    for note in costs.notes:
        con.print(f"  {note}")
    if out["plan"].cpu_contention:
        con.print("  device = cpu: trainer and rollout share the host's cores; the prediction is the serial bound "
                  "(Σ busy time), not the overlap the simulator alone would show")
    bad = [v for k in ("plan", "sync", "colocated") if k in out for v in out[k].violations]
    con.print(f"simulated {out['plan'].versions_simulated} versions per layout in {seconds:.1f} s"
              + (f"; [red]{len(bad)} loop property violations[/]" if bad else ""))


def _loop_features(layout: Layout, costs: CostModel) -> list[str]:
    """What the loop does beyond the plain schedule, as the plan models it."""
    lp, out = layout.loop, []
    if lp.rollout.deterministic:
        out.append("deterministic (syncs wait for the version's work, one group generated at a time)")
    if lp.dynamic_sampling:
        out.append(f"dynamic sampling (keep rate {costs.keep_rate:.2f}: {1 / max(1e-6, costs.keep_rate):.2f} "
                   "groups generated per group trained)")
    if lp.multi_turn:
        out.append("multi-turn (tool turns)")
    return out


def _render_sweep(points: list[Any], top: int, seconds: float) -> None:
    from rich.table import Table

    con = stdout_console()
    t = Table(title=f"sweep: best {min(top, len(points))} of {len(points)} (by samples/s)", title_justify="left")
    for col in ("rollout:trainer", "trigger", "staleness", "samples/s", "step", "max stale", "why"):
        t.add_column(col)
    for pt in points[:top]:
        p = pt.prediction
        t.add_row(f"{p.rollout_world}:{p.trainer_world}", str(pt.trigger), f"{pt.staleness:g}",
                  f"{p.samples_per_s:.3g}", f"{p.step_time_s:.3g} s", str(max(p.staleness_hist, default=0)), pt.reason)
    con.print(t)
    con.print(f"{len(points)} layouts simulated in {seconds:.1f} s (speed only: a larger trigger or staleness "
              "trains on staler samples)")


def expectation(run_file: Path, sets: list[str] | None, cal_path: Path | None) -> dict[str, Any]:
    """What `launch --plan` hands the run: the plan's predicted step time, samples/s and idle ratios for this
    run file, with the cost sources, so the dashboard can set the measured step time beside the prediction.

    Raises the same one-line errors as `asyncrl plan` (invalid run file, no cost source)."""
    from engine.predict.prediction import predict

    layout, costs = _setup(run_file, sets, cal_path)
    p = predict(layout, costs)["plan"]
    return {"step_time_s": p.step_time_s, "samples_per_s": p.samples_per_s,
            "trainer_idle_ratio": p.trainer_idle_ratio, "rollout_idle_ratio": p.rollout_idle_ratio,
            "sources": dict(costs.sources), "calibration": str(cal_path) if cal_path else None,
            "made_at": time.time()}


@handle_errors
def command(
    run_file: Annotated[Path | None, typer.Argument(metavar="RUN.toml", help="The run file to plan.")] = None,
    set_: SetOpt = None,
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help="A calibration.json (from --calibrate, or declared).")
    ] = None,
    calibrate: Annotated[
        Path | None, typer.Option("--calibrate", metavar="RUN_DIR",
                                  help="Measure the costs of a finished run and write RUN_DIR/calibration.json.")
    ] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", metavar="DIMS",
                                 help="Try a grid: rollout_fraction,trigger,staleness (name=v1:v2:… for values).")
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="With --sweep: how many layouts to print.")] = 5,
    keep_rate: Annotated[
        float | None, typer.Option("--keep-rate", min=0.01, max=1.0,
                                   help="Dynamic sampling (algorithm.filter_groups): the fraction of sampled groups "
                                   "the trainer keeps; default: the calibration's measured one, else 1.")
    ] = None,
    slots: Annotated[
        int | None, typer.Option("--slots", min=1, help="Model replicas that serve K dispatches at once (continuous "
                                 "batching of per-prompt requests, as asyncrl's streaming rollouter and verl's "
                                 "server); default: the streaming rollouter's, min(12, max_num_seqs // n), at most "
                                 "32 / replicas (the simulation's cost); 1: one dispatch per replica, got back "
                                 "whole. With --calibrate: the model the decode cost is fitted under.")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Predict a run's speed before launching it: step time, samples/s, idle ratios, staleness, async ÷ sync.

    Exit codes: 0 predicted · 1 invalid run file or no cost source · 2 usage.
    """
    if calibrate is not None:
        _calibrate(calibrate, json_, slots)
        return
    if run_file is None:
        raise UsageProblem("pass a run file (asyncrl plan RUN.toml) or --calibrate RUN_DIR")
    layout, costs = _setup(run_file, set_, calibration, keep_rate)
    from engine.predict.prediction import predict

    if slots is not None:
        import dataclasses

        layout = dataclasses.replace(layout, slots=slots)
    t0 = time.monotonic()
    if sweep is not None:
        from engine.predict.sweep import SweepSpecError, parse
        from engine.predict.sweep import run as run_sweep

        try:
            grid = parse(sweep)
        except SweepSpecError as e:
            raise UsageProblem(str(e)) from None
        points = run_sweep(layout, costs, grid)
        if json_:
            emit_json({"layout": layout.to_json(), "costs": costs.to_json(),
                       "points": [p.to_json() for p in points[:top]], "simulated": len(points),
                       "seconds": time.monotonic() - t0})
            return
        _render_sweep(points, top, time.monotonic() - t0)
        return
    out = predict(layout, costs)
    seconds = time.monotonic() - t0
    if json_:
        doc: dict[str, Any] = {"layout": layout.to_json(), "costs": costs.to_json(), "seconds": seconds}
        doc.update({k: (v.to_json() if hasattr(v, "to_json") else v) for k, v in out.items()})
        emit_json(doc)
        return
    _render(layout, costs, out, seconds)
