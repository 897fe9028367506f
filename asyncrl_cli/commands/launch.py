"""`asyncrl launch RUN.toml`: validate, then start the run (or, with --dry-run, show what would start).

Every launch gets a run id (`<name>-<6 hex digits>`, in `<run dir>/run.json` and the registry of live runs);
a second launch of a name live on this machine is refused unless `--allow-same-name`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.syntax import Syntax

from asyncrl_cli.commands._common import JsonOpt, SetOpt, analyze
from asyncrl_cli.errors import AsyncrlError, handle_errors
from asyncrl_cli.output import emit_json, stderr_console, stdout_console
from asyncrl_cli.report import render_derived, render_headline, render_placement, render_problems
from engine.telemetry.val_curve import show_validation_curve
from engine.config.precision import policy_of

if TYPE_CHECKING:
    from asyncrl_cli.config.loader import Analysis


def artifact_paths(an: Analysis) -> dict[str, str]:
    """The files a launch writes first, in the run directory (`logging.run_dir`; a launch moves to a timestamped
    sibling when that directory is in use): the resolved config and where each value came from. `--dry-run` names
    them and writes nothing."""
    from engine.telemetry.sinks import CONFIG_FILE, PROVENANCE_FILE  # the names the driver writes

    assert an.config is not None
    run_dir = Path(an.config.logging.run_dir)
    return {"run_dir": str(run_dir), "config": str(run_dir / CONFIG_FILE),
            "provenance": str(run_dir / PROVENANCE_FILE)}


def relaunch_command(
    run_file: Path, sets: list[str] | None, address: str | None, allow_same_name: bool, insecure: bool = False
) -> list[str]:
    """This launch as typed, without `--resume` (the resume hint adds `--resume <run dir>`)."""
    args = ["asyncrl", "launch", str(run_file)]
    for s in sets or []:
        args += ["--set", s]
    if address:
        args += ["--address", address]
    if allow_same_name:
        args.append("--allow-same-name")
    if insecure:
        args.append("--insecure")
    return args


def _predict(run_file: Path, sets: list[str] | None, calibration: Path | None) -> dict:
    """`--plan`: the prediction the run carries (one line on stderr); a run that cannot be planned is not started."""
    from asyncrl_cli.commands.plan import expectation

    pred = expectation(run_file, sets, calibration)
    stderr_console().print(f"plan: step {pred['step_time_s']:.3g} s, {pred['samples_per_s']:.3g} samples/s, "
                           f"trainer idle {pred['trainer_idle_ratio']:.2f}, rollout idle "
                           f"{pred['rollout_idle_ratio']:.2f} (costs: {', '.join(sorted(set(pred['sources'].values())))})")
    return pred


def _megatron_settings(an: Analysis) -> dict[str, list[dict[str, Any]]]:
    """The Megatron performance settings resolved for the run's device and, where that is an accelerator, for CPU
    (the fallback the same preset runs with there); {} for other backends (`engine.plan.megatron_perf`)."""
    if an.config.trainer.backend != "megatron":
        return {}
    from engine.plan.megatron_perf import resolve_perf

    devices = dict.fromkeys([an.hardware.device, "cpu"])
    return {d: [dataclasses.asdict(s) for s in resolve_perf(an.config, d)] for d in devices}


@handle_errors
def command(
    run_file: Annotated[Path, typer.Argument(metavar="RUN.toml", help="The run file.")],
    set_: SetOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the resolved config, the placement and the files a launch "
                           "would write (and where); start nothing, write nothing.")
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(
            "--address", help="Ray cluster address (auto, ray://host:port); default: a local cluster."
        ),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="auto|PATH",
            help="Resume from the latest checkpoint (auto) or a checkpoint directory.",
        ),
    ] = None,
    tui: Annotated[bool, typer.Option("--tui", help="Open the live dashboard while the run goes.")] = False,
    name: Annotated[
        str | None, typer.Option("--name", help="Run name (same as --set name=NAME; also names the run dir).")
    ] = None,
    allow_same_name: Annotated[
        bool,
        typer.Option("--allow-same-name", help="Start even if a run of this name is live on this machine."),
    ] = False,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Run on a Ray without token authentication (RAY_AUTH_MODE=disabled, "
                           "or an --address cluster that accepts anyone); refused otherwise. The run's events warn.")
    ] = False,
    with_plan: Annotated[
        bool, typer.Option("--plan", help="Predict the step time first (asyncrl plan); the dashboard shows it "
                           "beside the measured one.")
    ] = False,
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help="With --plan: a calibration.json (asyncrl plan --calibrate).")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Validate RUN.toml and start it on Ray; exits with the run's status."""
    if name is not None:
        set_ = [*(set_ or []), f"name={json.dumps(name)}"]
    an = analyze(run_file, set_)
    if an.exit_code != 0 or an.config is None:
        con = stderr_console()
        render_headline(con, an)
        render_problems(con, an.problems)
        raise typer.Exit(an.exit_code or 1)
    assert an.derived is not None and an.hardware is not None  # exit code 0: both were resolved
    from engine.plan.auto import wanted
    from engine.plan.run_plan import resolve_plan  # pure Python: M, R, the placement, once for both paths

    plan = resolve_plan(an.config, hardware=an.hardware, derived=an.derived, provenance=an.provenance.to_json(),
                        base_dir=run_file.resolve().parent)
    if dry_run:  # writes nothing: the files a launch would write are named, not created
        files = artifact_paths(an)
        if json_:
            emit_json(
                {
                    "config": an.config.model_dump(mode="json"),
                    "measured_at_launch": [k for k, on in wanted(an.config).items() if on],
                    "placement": plan.placement.to_json(),
                    "weight_sync": _weight_sync(plan),
                    "weight_sync_quantization": an.config.rollout.quantization and (
                        an.config.rollout.quantization + _fp8_note(an.config.rollout.quantization)),
                    "derived": an.derived.to_json(),
                    "precision": dataclasses.asdict(policy_of(an.config)),
                    "megatron_settings": _megatron_settings(an),
                    "files": files,
                    "provenance": an.provenance.to_json(),
                    "written": False,
                    "problems": [p.to_json() for p in an.problems],
                }
            )
            return
        con = stdout_console()
        con.print(
            Syntax(
                json.dumps(an.config.model_dump(mode="json"), indent=2),
                "json",
                theme="ansi_dark",
                background_color="default",
            )
        )
        render_derived(con, an)
        con.print(f"[bold]trainer precision[/bold]  {policy_of(an.config).describe()}")
        for device, settings in _megatron_settings(an).items():
            con.print(f"[bold]megatron settings on {device}[/bold]  " + "; ".join(
                f"{s['key']} = {s['value']} ({s['why']})" for s in settings), soft_wrap=True)
        render_placement(con, plan.placement)
        con.print(f"[bold]weight sync[/bold]  {_weight_sync(plan)} (rollout.weight_sync = "
                  f"{an.config.rollout.weight_sync!r})" + _fp8_note(an.config.rollout.quantization))
        render_problems(con, [p for p in an.problems if p.severity == "warning"])
        auto_keys = [k for k, on in wanted(an.config).items() if on]
        if auto_keys:  # the placement above shows the automatic split for an "auto" cpu_threads
            con.print(f"auto: {', '.join(auto_keys)} measured at launch (fp32 vs bf16 and 1 vs every core at the "
                      "run's shapes, on the machine that runs it)")
        con.print(f"dry run: nothing started, nothing written. A launch would create {files['run_dir']}/ and write "
                  f"{files['config']}, {files['provenance']}, metrics.jsonl and events.jsonl there.")
        return
    from engine.runtime.terminal import install  # light: a closed pipe or a full disk must not end the launch

    install()
    render_problems(stderr_console(), [p for p in an.problems if p.severity == "warning"])
    prediction = _predict(run_file, set_, calibration) if with_plan or calibration else None
    try:
        from engine.runtime.driver import run
    except ImportError as e:
        raise AsyncrlError(
            f"the engine driver cannot be imported: {e}",
            "install asyncrl with its engine dependencies (torch, ray), or use --dry-run",
        ) from None
    from asyncrl_cli.tui import run_dashboard_with  # light: Textual loads when the dashboard starts

    relaunch = relaunch_command(run_file, set_, address, allow_same_name, insecure)
    if prediction is not None:
        relaunch += ["--plan"] + (["--calibration", str(calibration)] if calibration else [])
    rc = run(plan, address=address, resume=resume, tui=run_dashboard_with if tui else None,
             allow_same_name=allow_same_name, command=relaunch, prediction=prediction, insecure=insecure)
    show_validation_curve(int(rc or 0), an.config.logging.run_dir)
    raise typer.Exit(int(rc or 0))


def _weight_sync(plan: object) -> str:
    """The transport the run's weight syncs take (`RunPlan.weight_sync`), or why it has none."""
    try:
        return plan.weight_sync  # type: ignore[attr-defined]
    except ValueError as e:
        return f"none: {e}"


FP8_STATUS = ("sender-side per-bucket blockwise quantisation tested on CPU; vLLM serving block-FP8 and loading fp8 "
              "syncs on CUDA is unverified")


def _fp8_note(quantization: str | None) -> str:
    """What `rollout.quantization = "fp8"` does to the sync and how far it is verified (docs/architecture.md)."""
    if quantization != "fp8":
        return ""
    return f"; fp8: 128×128 blocks, weight + weight_scale_inv ({FP8_STATUS})"
