"""`asyncrl status [RUN] [--json] [--address ADDR] [--replay RUN_DIR]`: one look at a run.

Without RUN it lists every live run on this machine (from the registry of live runs: id, name, dir, Ray
address, pid, start time — no Ray connection needed), or with `--address` those on that cluster. RUN is a
run id, a name, or a unique id prefix. The summary is computed by the dashboard's
pure `DashboardModel` from one `snapshot()`, so the numbers match what `asyncrl attach` shows.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from asyncrl_cli.commands._common import ReplayOpt, RunAddressOpt
from asyncrl_cli.commands._control import command_connection, control_errors
from asyncrl_cli.errors import UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

RECENT_EVENTS = 8


def summarize(snap: dict[str, Any]) -> dict[str, Any]:
    """The status document: progress, KPIs, knobs, workers and the latest events of one snapshot."""
    from asyncrl_cli.tui import model as m

    model = m.DashboardModel()
    model.apply(snap)
    kpis = {
        key: model.latest(key)
        for key in (
            m.TRAINER_TPS,
            m.ROLLOUT_TPS,
            m.QUEUE,
            m.STALE_MEAN,
            m.STALE_MAX,
            m.STALE_BOUND,
            m.IS_CLIP,
            m.RS_MASK,
            m.ESS,
            m.REWARD,
        )
    }
    return {
        "run": model.run.get("name"),
        "id": model.run.get("id"),
        "state": model.state,
        "step": model.step,
        "total_steps": model.total_steps,
        "policy_version": model.policy_version,
        "elapsed_s": model.elapsed,
        "eta_s": model.eta,
        "address": model.run.get("address"),
        "run_dir": model.run.get("run_dir"),
        "kpis": kpis,
        "knobs": model.knobs,
        "workers": model.worker_rows(),
        "recent_events": list(model.events)[-RECENT_EVENTS:],
    }


def _print_human(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from asyncrl_cli.tui import model as m
    from asyncrl_cli.tui.format import MISSING, fmt_duration, fmt_num, fmt_pct, fmt_rate, fmt_value

    con = stdout_console()
    k = doc["kpis"]
    con.print(
        f"[bold]{doc['run']}[/] ({doc.get('id') or MISSING})"
        f" · {str(doc['state']).upper()} · policy v{fmt_num(doc['policy_version'])} · "
        f"step {fmt_num(doc['step'])}/{fmt_num(doc['total_steps'])}"
        f" · elapsed {fmt_duration(doc['elapsed_s'])}"
        f" · ETA {'done' if doc['state'] == 'finished' else fmt_duration(doc['eta_s'])}"
    )
    con.print(f"address {doc['address'] or MISSING} · run dir {doc['run_dir'] or MISSING}")
    con.print(
        f"throughput  trainer {fmt_rate(k[m.TRAINER_TPS])} tok/s · rollout {fmt_rate(k[m.ROLLOUT_TPS])} "
        f"tok/s · queue {fmt_num(k[m.QUEUE])}"
    )
    con.print(
        f"staleness   mean {fmt_num(k[m.STALE_MEAN], 2)} · max {fmt_num(k[m.STALE_MAX])} · bound "
        f"{fmt_num(k[m.STALE_BOUND])}     IS clip {fmt_pct(k[m.IS_CLIP])} · mask {fmt_pct(k[m.RS_MASK])} · "
        f"ESS {fmt_num(k[m.ESS])}     reward {fmt_num(k[m.REWARD])}"
    )
    knobs = Table("knob", "value", "version", "status", title="knobs", title_justify="left", box=None)
    for name, kn in doc["knobs"].items():
        status = (
            f"pending → {fmt_value(kn['value'])}"
            if kn.get("pending")
            else f"applied at step {kn['applied_at_step']}"
            if kn.get("applied_at_step") is not None
            else "initial"
        )
        who = f" by {kn['requested_by']}" if kn.get("requested_by") else ""
        knobs.add_row(name, fmt_value(kn.get("applied_value")), str(kn.get("version")), status + who)
    con.print(knobs)
    workers = Table(
        "worker", "role", "state", "tok/s", "weights", "lag", title="workers", title_justify="left", box=None
    )
    for w in doc["workers"]:
        workers.add_row(
            str(w["id"]),
            str(w.get("role") or MISSING),
            str(w.get("state") or MISSING),
            fmt_rate(w.get("tokens_per_s")),
            fmt_num(w.get("weight_version")),
            fmt_num(w.get("lag")),
        )
    con.print(workers)
    con.print("[bold]recent events[/]")
    for ev in doc["recent_events"]:
        style = {"warning": "yellow", "error": "red"}.get(str(ev.get("level")), "")
        line = f"  step {fmt_num(ev.get('step'))}  {ev.get('kind')}: {ev.get('message')}"
        con.print(f"[{style}]{line}[/]" if style else line, markup=bool(style), highlight=False)


def _list_runs(address: str | None, as_json: bool) -> None:
    from rich.table import Table

    from engine.control.client import list_live_runs
    from engine.control.registry import format_time

    with command_connection(), control_errors():
        runs = list_live_runs(address)
    if as_json:
        emit_json({"runs": runs})
        return
    con = stdout_console()
    where = f"on the cluster at {address}" if address else "on this machine"
    if not runs:
        con.print(f"no live asyncrl run {where}")
        return
    table = Table("id", "name", "run dir", "ray address", "pid", "started", box=None)
    for r in runs:
        table.add_row(r["id"], r["name"], str(r.get("run_dir") or "-"), str(r.get("address") or "starting"),
                      str(r.get("pid") or "-"), format_time(r["started"]) if r.get("started") else "-")
    con.print(table)


@handle_errors
def command(
    run: Annotated[
        str | None, typer.Argument(help="Run id, name or unique id prefix; omit to list the live runs.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    address: RunAddressOpt = None,
    replay: ReplayOpt = None,
) -> None:
    """Show a run's state, progress, KPIs, knobs (with pending changes), workers and latest events."""
    from engine.control.client import ControlClient, ReplaySource

    if replay is not None and (run or address):
        raise UsageProblem("--replay reads a run directory: do not also pass RUN or --address")
    if replay is None and run is None:
        _list_runs(address, as_json)
        return
    with command_connection(), control_errors():
        source = ReplaySource(replay) if replay is not None else ControlClient(run, address)
        snap = source.snapshot(0)
    doc = summarize(snap)
    if as_json:
        emit_json(doc)
    else:
        _print_human(doc)
