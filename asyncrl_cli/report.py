"""Human-readable rendering of an `Analysis`: problems, model, sizes, memory, provenance, placement."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from asyncrl_cli.config.dotted import get_path
from asyncrl_cli.config.problems import Problem

if TYPE_CHECKING:
    from asyncrl_cli.config.loader import Analysis
    from engine.plan.placement import Placement

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def render_problems(con: Console, problems: list[Problem]) -> None:
    """One line per problem: severity, file:line, key, message, hint."""
    for p in problems:
        key = f"  [bold]{escape(p.key)}[/]" if p.key else ""
        hint = f"  [dim]— {escape(p.hint)}[/]" if p.hint else ""
        con.print(
            f"[{_STYLE[p.severity]}]{p.severity:<7}[/] {escape(p.where)}{key}  {escape(p.message)}{hint}"
        )


def render_headline(con: Console, an: Analysis) -> None:
    """`✓ file is valid` or `✗ file: N errors` with the exit code's meaning."""
    n_err = sum(p.severity == "error" for p in an.problems)
    n_warn = sum(p.severity == "warning" for p in an.problems)
    src = escape(an.provenance.root or "")
    if an.exit_code == 0:
        extra = f" ({n_warn} warning{'s' * (n_warn != 1)})" if n_warn else ""
        con.print(f"[bold green]✓[/] {src} is valid{extra}")
    elif an.exit_code == 3:
        con.print(f"[bold red]✗[/] {src} does not fit the hardware: {n_err} error{'s' * (n_err != 1)}")
    else:
        con.print(f"[bold red]✗[/] {src} is invalid: {n_err} error{'s' * (n_err != 1)}")


def render_model(con: Console, an: Analysis) -> None:
    """Parameter counts and shape of the model."""
    m = an.model
    if m is None:
        return
    moe = f", {m.experts} experts ({m.experts_per_token} active)" if m.is_moe else ""
    vis = f", vision tower {_billions(m.params_vision)}" if m.params_vision else ""
    con.print(
        f"[bold]model[/] {escape(m.model_type)}: {_billions(m.params_total)} parameters, "
        f"{_billions(m.params_active)} active; {m.layers} layers, hidden {m.hidden}, "
        f"{m.heads}/{m.kv_heads} heads{moe}{vis}  [dim]({escape(m.source)})[/]"
    )


def render_derived(con: Console, an: Analysis) -> None:
    """The sizes verl prints at start-up."""
    d = an.derived
    if d is None:
        return
    t = Table(
        title="derived (prompts; × rollout.n for sequences)",
        title_justify="left",
        show_header=False,
        box=None,
        pad_edge=False,
    )
    t.add_column(style="bold")
    t.add_column(justify="right")
    rows: list[tuple[str, Any]] = [
        ("required_samples", d.required_samples),
        ("max_required_samples", d.max_required_samples),
        ("max_queue_size", d.max_queue_size),
        ("staleness_threshold (effective)", d.staleness_threshold),
        ("prompts per version", d.prompts_per_version),
        ("train_size", d.train_size),
        ("total_rollout_steps", d.total_rollout_steps),
        ("total_train_steps (versions)", d.total_train_steps),
        ("total local steps", d.total_local_steps),
        ("optimizer steps per local step", d.optimizer_steps_per_local_step),
        ("trainer GPUs / dp", f"{d.trainer_world} / {d.trainer_dp}"),
        ("rollout GPUs / replicas", f"{d.rollout_world} / {d.rollout_replicas}"),
    ]
    for k, v in rows:
        t.add_row(k, "?" if v is None else str(v))
    con.print(t)


def render_fit(con: Console, an: Analysis) -> None:
    """Per-GPU memory of trainer and rollout, component by component."""
    if an.fit is None:
        return
    t = Table(title="memory per GPU (GB)", title_justify="left")
    t.add_column("role")
    t.add_column("components")
    t.add_column("total", justify="right")
    t.add_column("capacity", justify="right")
    t.add_column("fits")
    for rf in (an.fit.trainer, an.fit.rollout):
        comps = ", ".join(f"{k} {v:.1f}" for k, v in rf.components_gb.items())
        t.add_row(
            rf.role,
            comps,
            f"{rf.total_gb:.1f}",
            f"{rf.capacity_gb:.1f}",
            "[green]yes[/]" if rf.fits else "[red]no[/]",
        )
    con.print(t)
    det = an.fit.rollout.details
    con.print(
        f"[dim]rollout KV cache: {det['kv_gb_available']} GB per GPU holds {det['seqs_at_full_length']} "
        f"sequences of {det['max_sequence_tokens']} tokens (max_num_seqs {det['max_num_seqs']})[/]"
    )


def render_memory_terms(con: Console, an: Analysis) -> None:
    """`validate --explain`: each role's predicted peak term by term, with what the term is."""
    from engine.plan.memory import ROLLOUT_TERMS, TERMS

    if an.fit is None:
        return
    for rf in (an.fit.trainer, an.fit.rollout):
        unit = "trainer rank" if rf.role == "trainer" else "rollout replica GPU"
        notes = TERMS if rf.role == "trainer" else ROLLOUT_TERMS
        t = Table(title=f"predicted peak per {unit}: {rf.total_gb:.1f} of {rf.capacity_gb:.1f} GB",
                  title_justify="left")
        t.add_column("term", style="bold")
        t.add_column("GB", justify="right")
        t.add_column("what")
        for name, gb in rf.components_gb.items():
            t.add_row(name, f"{gb:.2f}", notes.get(name, ""))
        for name, gb in rf.host_gb.items():
            t.add_row(f"[dim]{name} (host)[/]", f"[dim]{gb:.2f}[/]", f"[dim]{notes.get(name, '')}; not on the device[/]")
        con.print(t)
    d = an.fit.trainer.details
    if "tokens_per_micro_batch" in d:
        counted = {"packed": " (packed rows: real tokens)", "padded": " (rows × longest row)"}
        con.print(f"[dim]trainer: {d['tokens_per_micro_batch']} tokens per update micro-batch"
                  f"{counted.get(d.get('token_count', ''), '')}, "
                  f"{d['log_prob_tokens_per_micro_batch']} per log-prob micro-batch, recompute "
                  f"{'on' if d['recompute'] else 'off'}, activations from the {d['activations_from']}; "
                  f"{d['precision']}[/]")


def render_provenance(con: Console, an: Analysis) -> None:
    """Which file or flag set each key (defaults omitted): a table when it fits the console's width, else one
    line per key (`key = value  ← source`), so that no key, value or source is ever cut."""
    from rich.cells import cell_len

    if an.config is None:
        return
    data = an.config.model_dump(mode="json")
    rows: list[tuple[str, str, str, str]] = []
    for key, origin in sorted(an.provenance.origins.items()):
        src = origin.where + (f" ({origin.note})" if origin.note else "")
        env = f"env {', '.join(origin.env_vars)}" if origin.env_vars else ""
        rows.append((key, json.dumps(get_path(data, key)), src, env))
    title = "provenance (keys not listed keep their defaults)"
    widths = [max([cell_len(h), *(cell_len(r[i]) for r in rows)]) for i, h in enumerate(("key", "value"))]
    widths.append(max([cell_len("set by"), *(cell_len(f"{r[2]} {r[3]}".strip()) for r in rows)]))
    if sum(widths) + 3 * len(widths) + 1 <= con.width:  # `│ a │ b │ c │`: a bar and two spaces per column
        t = Table(title=title, title_justify="left")
        for name, style in (("key", "bold"), ("value", None), ("set by", None)):
            t.add_column(name, style=style, overflow="fold")
        for key, value, src, env in rows:
            t.add_row(escape(key), escape(value), escape(src) + (f" [dim]{escape(env)}[/]" if env else ""))
        con.print(t)
    else:
        con.print(f"[italic]{title}[/]", soft_wrap=True)
        for key, value, src, env in rows:
            tail = f" [dim]{escape(env)}[/]" if env else ""
            con.print(f"[bold]{escape(key)}[/] = {escape(value)}  [dim]←[/] {escape(src)}{tail}", soft_wrap=True)
    con.print(f"[dim]merge order: {escape(' → '.join(an.provenance.files))} → --set[/]", soft_wrap=True)


def render_placement(con: Console, plan: Placement) -> None:
    """Actors, GPUs per actor, nodes."""
    t = Table(title=f"placement ({plan.total_gpus} {plan.device} accelerators)", title_justify="left")
    t.add_column("actor", style="bold")
    t.add_column("count", justify="right")
    t.add_column("GPUs each", justify="right")
    t.add_column("nodes")
    t.add_column("layout")
    for a in plan.actors:
        nodes = ", ".join(a.nodes) if len(a.nodes) <= 4 else f"{a.nodes[0]} … {a.nodes[-1]} ({len(a.nodes)})"
        t.add_row(a.name, str(a.count), str(a.gpus_per_actor), nodes, escape(a.layout))
    con.print(t)
    rows = plan.node_rows()
    if rows:
        g = Table(title=f"placement groups ({len(rows)} nodes, one bundle per accelerator, STRICT_PACK per node)",
                  title_justify="left")
        g.add_column("node", style="bold")
        g.add_column("bundles", justify="right")
        g.add_column("actors → bundles")
        for node, bundles, what in rows:
            g.add_row(node, str(bundles), escape(what))
        con.print(g)
