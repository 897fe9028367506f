"""Run many random scenarios and collect the violations (what `asyncrl simulate --check` prints)."""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterator

from engine.loop.sim.scenario import Scenario, draw
from engine.loop.sim.world import Outcome, World


def run_scenario(scenario: Scenario) -> Outcome:
    """Run one scenario to its end."""
    return World(scenario).run()


def scenario_seeds(count: int, seed: int) -> Iterator[int]:
    """The seeds of `count` scenarios drawn from master seed `seed` (each replays alone)."""
    r = random.Random(seed)
    for _ in range(count):
        yield r.randrange(2**31)


def check(count: int, seed: int, on_outcome: Callable[[Outcome], None] | None = None,
          multi_turn: bool | None = None, part: tuple[int, int] = (0, 1)) -> list[Outcome]:
    """Run `count` random scenarios (`multi_turn`: forced on or off, None: drawn); returns the outcomes that
    have violations. `part = (i, k)`: only the i-th of every k scenarios (one of k worker processes). The
    young-generation GC threshold is raised meanwhile (a scenario allocates hundreds of thousands of
    short-lived commands and requests; the default threshold spends ~10 % of the time collecting)."""
    bad: list[Outcome] = []
    threshold = gc.get_threshold()
    gc.set_threshold(20_000, 20, 20)
    i, k = part
    try:
        for j, s in enumerate(scenario_seeds(count, seed)):
            if j % k != i:
                continue
            out = run_scenario(draw(s, multi_turn))
            if on_outcome is not None:
                on_outcome(out)
            if out.violations:
                bad.append(out)
    finally:
        gc.set_threshold(*threshold)
    return bad
