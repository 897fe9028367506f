"""`asyncrl init`: write a commented run file for a model, a dataset preset and a hardware preset."""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import tomlkit
import typer

from asyncrl_cli.config.catalog import RUN_SCHEMA_FILE, find_preset, list_presets, presets_dir
from asyncrl_cli.config.hf_model import ModelConfigError, ModelFacts, read_model_facts
from asyncrl_cli.errors import DoesNotFit, InvalidConfig, UsageProblem, handle_errors
from asyncrl_cli.output import stdout_console

if TYPE_CHECKING:  # the schema-backed modules load when the command runs, not for `--help`
    from engine.plan.hardware import HardwarePreset
    from asyncrl_cli.config.init_choices import InitChoices

SECTIONS = ("model", "resources.trainer", "resources.rollout", "trainer", "rollout", "algorithm.rollout_correction",
            "async_training")


def _ask(missing: str, choices: list[str] | None) -> str:
    from rich.prompt import Prompt

    return Prompt.ask(missing, choices=choices) if choices else Prompt.ask(missing)


def _dataset_table(name: str) -> dict[str, Any]:
    matches = [m for m in find_preset(f"datasets/{name}")]
    if not matches:
        names = [r.name for r in list_presets("datasets")]
        raise UsageProblem(f"unknown dataset {name!r}", f"choose one of {', '.join(names)}")
    data = tomllib.loads(matches[0].path.read_text(encoding="utf-8")).get("data", {})
    return dict(data)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._").lower() or "run"


def _model_ref(model: str) -> str:
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else model


def render_run_file(
    choices: InitChoices, facts: ModelFacts, model: str, dataset: str, hw: HardwarePreset, command: str, out: Path
) -> str:
    """The TOML text: a `#:schema` header, the command that runs it, and commented tables."""
    schema = os.path.relpath(presets_dir() / RUN_SCHEMA_FILE, out.resolve().parent)
    train = choices.get("resources.trainer.nnodes") * choices.get("resources.trainer.gpus_per_node")
    roll = choices.get("resources.rollout.nnodes") * choices.get("resources.rollout.gpus_per_node")
    name = _slug(f"{Path(model).name or model}-{dataset}")
    header = [
        f"#:schema {schema}",
        f"# {Path(model).name or model} · GRPO on {dataset} · {choices.get('trainer.backend')} + "
        f"{choices.get('rollout.backend')} · {roll} rollout : {train} train on {hw.name}",
        f"# Written by: {command}",
        f"# Check:  asyncrl validate {out}",
        f"# Run:    asyncrl launch {out}",
        "",
    ]
    doc = tomlkit.document()
    doc.add("name", name)
    doc.add("extends", [f"datasets/{dataset}", f"hardware/{hw.name}"])
    values = {"model.path": _model_ref(model), **choices.values}
    reasons = dict(choices.reasons)
    moe = f", {facts.params_active / 1e9:.2f}B active" if facts.is_moe else ""
    reasons["model.path"] = f"{facts.model_type}: {facts.params_total / 1e9:.2f}B parameters{moe}"
    for section in SECTIONS:
        keys = [k for k in values if k.rsplit(".", 1)[0] == section]
        if not keys:
            continue
        table = tomlkit.table()
        for k in keys:
            item = tomlkit.item(values[k])
            if k in reasons:
                item.comment(reasons[k])
            table.add(k.rsplit(".", 1)[1], item)
        parts = section.split(".")
        if len(parts) == 1:
            doc.add(section, table)
        else:
            if parts[0] not in doc:
                doc.add(parts[0], tomlkit.table(is_super_table=True))
            doc[parts[0]].add(parts[1], table)  # type: ignore[union-attr]
    return "\n".join(header) + tomlkit.dumps(doc)


@handle_errors
def command(
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Local HF model dir or hub id (read offline).")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", "-d", help="A dataset preset, e.g. dapo-math, geo3k, copy.")
    ] = None,
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="A hardware preset, e.g. h100, ascend-910b, cpu.")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="Accelerators in total (default: one node).")
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write.")] = Path("run.toml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented run file that [bold]validate[/] accepts: backend, parallelism, GPU split, batches."""
    from engine.plan.hardware import HardwareNotFound, hardware_names, load_hardware
    from asyncrl_cli.config.loader import analyze_run_config
    from asyncrl_cli.config.init_choices import InitRefused, choose_init_settings
    from asyncrl_cli.report import render_headline, render_model, render_problems

    tty = sys.stdin.isatty()
    missing = [
        f for f, v in (("--model", model), ("--dataset", dataset), ("--hardware", hardware)) if v is None
    ]
    if missing and not tty:
        raise UsageProblem(
            f"missing {', '.join(missing)}", "pass them as flags, or run in a terminal to be asked"
        )
    model = model or _ask("model (local dir or hub id)", None)
    dataset = dataset or _ask("dataset", [r.name for r in list_presets("datasets")])
    hardware = hardware or _ask("hardware", hardware_names())
    if output.exists() and not force:
        raise UsageProblem(f"{output} exists", "pass --force to overwrite it")
    try:
        hw = load_hardware(hardware)
    except HardwareNotFound as e:
        raise UsageProblem(str(e)) from None
    data = _dataset_table(dataset)
    try:
        facts = read_model_facts(model)
    except ModelConfigError as e:
        raise InvalidConfig(str(e), "pass a local directory that holds config.json") from None
    try:
        choices = choose_init_settings(facts, hw, data, gpus, _model_ref(model))
    except InitRefused as e:
        raise DoesNotFit(str(e)) from None
    cmd = f"asyncrl init --model {model} --dataset {dataset} --hardware {hardware}"
    cmd += f" --gpus {gpus}" if gpus else ""
    cmd += f" -o {output}"
    output.parent.mkdir(parents=True, exist_ok=True)
    draft = output.with_name(f".{output.name}.draft.toml")  # checked before it becomes the output
    draft.write_text(render_run_file(choices, facts, model, dataset, hw, cmd, output), encoding="utf-8")
    try:
        an = analyze_run_config(draft)
        if an.exit_code != 0:  # `choose_init_settings` checks each layout; this is the last word, and never written
            first = next((p.message for p in an.problems if p.severity == "error"), "it does not validate")
            raise DoesNotFit(f"init found no layout that validates: {first}")
        draft.replace(output)
    finally:
        draft.unlink(missing_ok=True)
    an = analyze_run_config(output)  # the report names the file the user has
    con = stdout_console()
    con.print(f"wrote {output}")
    render_headline(con, an)
    render_problems(con, [p for p in an.problems if p.severity != "info"])
    render_model(con, an)
    raise typer.Exit(an.exit_code)
