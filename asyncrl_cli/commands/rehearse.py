"""`asyncrl rehearse RUN.toml`: build every role of the run as `launch` would, at full scale, and step it once on
fake tensors and a fake process group in this one CPU process (`engine.rehearse`); compare each trainer rank's
rehearsed device peak with `validate`'s memory model.

Exit codes: 0 every role built and stepped within its device's memory · 1 a role failed (one line each, naming
the role, the rank and the phase), or the run file is invalid · 2 usage. A run `validate`'s memory model says
does not fit is rehearsed all the same (the rehearsal is the measurement the model is checked against).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from asyncrl_cli.commands._common import JsonOpt, SetOpt, analyze
from asyncrl_cli.errors import EXIT_DOES_NOT_FIT, EXIT_OK, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stderr_console, stdout_console
from asyncrl_cli.report import render_headline, render_problems

if TYPE_CHECKING:
    from asyncrl_cli.config.loader import Analysis

GB = 1e9
TOLERANCE = 0.15
"""How far the memory model may sit from the rehearsed device peak before the row is flagged."""


def model_memory(an: Analysis) -> dict[str, Any]:
    """`validate`'s trainer-rank memory model: its terms, its device total without the runtime constant (the
    tensors a rehearsal can count), and its host terms (bytes)."""
    if an.fit is None:
        return {}
    t = an.fit.trainer
    terms = {k: v * GB for k, v in t.components_gb.items()}
    return {"terms": terms, "total": t.total_gb * GB, "tensors": sum(v for k, v in terms.items() if k != "runtime"),
            "runtime": terms.get("runtime", 0.0), "host": {k: v * GB for k, v in t.host_gb.items()}}


def modelled(model: dict[str, Any], excludes: list[str] = ()) -> float | None:
    """The memory model's device tensors less the terms the rehearsal did not measure (`excludes`)."""
    if not model:
        return None
    return model["tensors"] - sum(model["terms"].get(k, 0.0) for k in excludes)


def comparison(rehearsed: int, model: dict[str, Any], excludes: list[str] = ()) -> float | None:
    """(model − rehearsed) / rehearsed of the device tensors; None without a model."""
    m = modelled(model, excludes)
    if m is None or rehearsed <= 0:
        return None
    return (m - rehearsed) / rehearsed


def _gb(n: float | int | None) -> str:
    return "—" if n is None else f"{n / GB:.1f}"


def render(report: Any) -> None:
    con = stdout_console()
    lay = ", ".join(f"{k} {v}" for k, v in report.layout.items())
    con.print(f"[bold]rehearsal[/] {escape(report.name)}: {report.backend} trainer on {report.world} × "
              f"{report.device} ({lay}); {report.seconds:.0f} s")
    for line in report.auto:
        con.print(f"  [dim]launch decides: {escape(line)}[/]")
    for role, mb in report.micro_batches.items():
        con.print(f"  micro-batch ({role}): {mb['rows']} × ({mb['prompt']} + {mb['response']}) = "
                  f"{mb['positions']} positions (budget {mb['budget']})")
    table = Table(title="trainer ranks (device: fake tensors at real shapes; host: what the code holds)")
    for col in ("rank class", "ranks", "device peak GB", "memory model GB", "model vs rehearsed",
                "host at start GB", "host resident GB", "host at export GB", "host at save GB", "host peak GB",
                "sync"):
        table.add_column(col, justify="left" if col in ("rank class", "ranks", "sync") else "right")
    for cls in report.ranks:
        diff = comparison(cls.device_peak, report.model_memory, cls.model_excludes)
        style = "" if diff is None or abs(diff) <= TOLERANCE else "[yellow]"
        sync = cls.sync
        dtypes = "+".join(sync.get("dtypes", {})) or "—"
        sync_text = (f"{_gb(sync.get('bytes'))} GB {dtypes}, {sync.get('buckets', 0)} buckets, "
                     f"{sync.get('staged_on', '')}") if sync.get("bytes") else "no buckets (not the sender)"
        table.add_row(escape(cls.name), cls.ranks, _gb(cls.device_peak),
                      _gb(modelled(report.model_memory, cls.model_excludes)),
                      f"{style}{diff:+.0%}" if diff is not None else "—", _gb(cls.host_start),
                      _gb(cls.host_resident), _gb(cls.host_export), _gb(cls.host_save), _gb(cls.host_peak),
                      escape(sync_text))
    con.print(table)
    for cls in report.ranks:
        peaks = ", ".join(f"{k} {_gb(v)}" for k, v in cls.phase_peaks.items())
        cats = ", ".join(f"{k} {_gb(v)}" for k, v in sorted(cls.peak_by_category.items(), key=lambda kv: -kv[1]))
        con.print(f"  [bold]{escape(cls.name)}[/]: running peak after {peaks or '—'} GB; at the peak: {cats or '—'}"
                  f" GB; checkpoint writes {', '.join(cls.checkpoint.get('writes', []))}; {cls.seconds:.0f} s")
        if cls.model_excludes:
            cls.notes.append(f"compared without the memory model's {', '.join(cls.model_excludes)} (not rehearsed)")
        for note in cls.notes:
            con.print(f"    [dim]{escape(note)}[/]")
    for node in report.nodes:
        ram = f"of {_gb(node['host_memory'])} GB node RAM" if node["host_memory"] else "(no host_memory_gb declared)"
        flag = "" if node["fits"] is not False else "[red] — over[/]"
        con.print(f"  host memory, node {node['node']} (trainer ranks {node['ranks']}): {_gb(node['host_peak'])} GB "
                  f"{ram}{flag}")
    planned = report.model_memory.get("sync_bytes")
    sent = next((c.sync for c in report.ranks if c.sync.get("bytes")), {})
    if planned and sent:
        con.print(f"  sync bytes: exported {_gb(sent['bytes'])} GB, `plan`'s formula {_gb(planned)} GB")
    t = report.transport
    if t:
        con.print(f"  weight sync: {t['kind']} on {t['device']} ({t['backend'] or 'no collective'}), "
                  f"{t['class']}, {t['receivers']} receiving ranks, buckets of {t['bucket_bytes'] >> 20} MiB")
    v = report.vllm
    if v.get("engine_args"):
        args = ", ".join(f"{k}={val}" for k, val in v["engine_args"].items() if k not in ("model", "tokenizer"))
        con.print(f"  vLLM ({escape(str(v['version']))}) on {v['device']}: {escape(args)}")
    if report.model_memory:
        m = report.model_memory
        con.print(f"  memory model (validate): {_gb(m['total'])} GB incl. {_gb(m['runtime'])} GB runtime; "
                  + ", ".join(f"{k} {_gb(b)}" for k, b in m["terms"].items()))


@handle_errors
def command(
    run_file: Annotated[Path, typer.Argument(metavar="RUN.toml", help="The run file.")],
    set_: SetOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Build every role as [bold]launch[/] would and step it once at full scale on fake tensors (no GPU, no
    weights): device and host peaks per rank class, the weight sync, vLLM's arguments, the checkpoint plan."""
    an = analyze(run_file, set_)
    if an.config is None or an.exit_code not in (EXIT_OK, EXIT_DOES_NOT_FIT):
        con = stderr_console()
        render_headline(con, an)
        render_problems(con, [p for p in an.problems if p.severity == "error"])
        raise typer.Exit(an.exit_code or 1)
    if an.exit_code == EXIT_DOES_NOT_FIT and not json_:  # the model may be wrong: the rehearsal measures
        stderr_console().print("[yellow]validate's memory model says this run does not fit; rehearsing it anyway[/]")
    from asyncrl_cli.config.hf_model import find_config_json

    base = run_file.resolve().parent
    config_path = find_config_json(an.config.model.path, base)
    if config_path is None:
        raise UsageProblem(f"no config.json for model.path = {an.config.model.path!r}",
                           "point model.path at a model directory, or use a model asyncrl knows")
    import json

    from engine.plan.run_plan import resolve_plan
    from engine.rehearse.run import rehearse

    assert an.derived is not None and an.hardware is not None
    plan = resolve_plan(an.config, hardware=an.hardware, derived=an.derived, base_dir=base)
    err = stderr_console()
    say = None if json_ else (lambda what: err.print(f"[dim]rehearsing {escape(what)} …[/]"))
    report = rehearse(plan, json.loads(config_path.read_text()), progress=say)
    report.model_memory = model_memory(an)
    if an.model is not None:
        from engine.plan.memory import export_bytes, sync_bytes
        from engine.plan.rollout_replica import embedding_params

        report.model_memory["sync_bytes"] = sync_bytes(an.model.params_total, export_bytes(an.config),
                                                       embedding_params(an.model), an.config.rollout.quantization)
    if json_:
        doc = report.to_json()
        doc["config_json"] = str(config_path)
        doc["comparison"] = {c.name: comparison(c.device_peak, report.model_memory, c.model_excludes)
                             for c in report.ranks}
        emit_json(doc)
    else:
        render(report)
    if not report.ok:
        for f in report.failures:
            err.print(f"[bold red]rehearsal failed:[/] {escape(f.line())}")
        raise typer.Exit(1)
