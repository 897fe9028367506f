"""`asyncrl simulate`: run the loop's real decision cores in the deterministic simulator.

`--check` draws N random scenarios (config within the schema's ranges, costs, faults, operator actions) from
`--seed`, runs each and checks liveness, the ledger, staleness, cadence, knobs and validation after every
event; each violation is one line with the scenario's seed, and `--replay SEED` reruns that one scenario.
`--workers K` splits the N scenarios over K processes (the same scenarios and violations as one process).
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any

import typer

from asyncrl_cli.errors import AsyncrlError, handle_errors


@handle_errors
def command(
    check: Annotated[bool, typer.Option("--check", help="Run random scenarios and check the loop's properties.")] = False,
    scenarios: Annotated[int, typer.Option("--scenarios", "-n", min=1, help="How many scenarios to draw.")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Master seed of the scenario draw.")] = 0,
    replay: Annotated[
        int | None, typer.Option("--replay", help="Rerun the one scenario of this seed (as printed) and describe it.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="With --replay: the scenario and outcome as JSON.")] = False,
    multi_turn: Annotated[bool | None, typer.Option(
        "--multi-turn/--single-turn", help="With --check: every scenario multi-turn (tools) or none (default: "
        "about a third).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=0, help="With --check: processes to spread the "
                                         "scenarios over (0: one per CPU).")] = 1,
) -> None:
    """Prove the loop live: run its decision cores over random scenarios in simulated time."""
    from engine.loop.sim.runner import run_scenario
    from engine.loop.sim.scenario import draw

    if replay is not None:
        s = draw(replay)
        out = run_scenario(s)
        if as_json:
            typer.echo(json.dumps({"scenario": s.to_json(), "outcome": {
                "finished": out.finished, "failure": out.failure, "sim_time": out.sim_time, "steps": out.steps,
                "versions": out.versions, "max_staleness": max(out.staleness, default=0),
                "violations": out.violations}}, indent=2))
        else:
            typer.echo(f"scenario {replay}: {s}")
            typer.echo(f"ended at t={out.sim_time:.2f}s (simulated): {out.steps} steps, {out.versions} versions, "
                       f"max staleness {max(out.staleness, default=0)}"
                       + (f", failed: {out.failure}" if out.failure else ""))
            for v in out.violations:
                typer.echo(v)
        if out.violations:
            raise typer.Exit(1)
        return
    if not check:
        raise AsyncrlError("nothing to do", "pass --check (random scenarios) or --replay SEED", exit_code=2)
    t0 = time.monotonic()
    k = min(scenarios, workers or os.cpu_count() or 1)
    if k == 1:
        bad, seen = _check_part(scenarios, seed, multi_turn, (0, 1))
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(k) as pool:
            parts = list(pool.map(_check_part, [scenarios] * k, [seed] * k, [multi_turn] * k,
                                  [(i, k) for i in range(k)]))
        bad = sorted((o for b, _ in parts for o in b), key=lambda o: o.seed)
        seen = {key: sum(c[key] for _, c in parts) for key in ("multi_turn", "tool_answers")}
    violations = [v for o in bad for v in o.violations]
    for v in violations:
        typer.echo(v)
    typer.echo(f"{scenarios} scenarios, {len(violations)} violations ({time.monotonic() - t0:.1f} s; "
               f"{seen['multi_turn']} multi-turn, {seen['tool_answers']} tool answers)")
    if violations:
        raise typer.Exit(1)


def _check_part(scenarios: int, seed: int, multi_turn: bool | None, part: tuple[int, int]) -> tuple[list, dict[str, Any]]:
    """One worker's share of `--check`: its outcomes with violations and what it saw."""
    from engine.loop.sim.runner import check as run_check

    seen = {"multi_turn": 0, "tool_answers": 0}

    def count(out: Any) -> None:
        seen["multi_turn"] += out.multi_turn
        seen["tool_answers"] += out.tool_answers

    return run_check(scenarios, seed, count, multi_turn, part), seen
