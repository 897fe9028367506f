"""The budgets every simulated scenario runs under, each derived from the scenario's work, so the checker always
ends: a run that exhausts one is reported as a `livelock` violation (with its seed and the last state of every
core, `World.describe`), never a hang.

- simulated time (`time_bound`): its work done strictly serially, × 4, plus the operator's last action;
- events (`event_bound`): an upper bound on a correct run's events (heap pops), × 2;
- stall (`stall_bound`): an upper bound on the events a correct run has in a row without progress (no model
  token returned, no prompt admitted, queued, trained, dropped or answered by a tool), × 4 — it catches a loop
  that spins without working (syncs without steps, dispatches without tokens) long before the others;
- at one instant, `World._kick` lets both shells act at most 1000 times and the trainer core answer at most
  `TRAINER_RUN_LIMIT` commands without waiting (`engine.loop.sim.trainer_shell`).

`CostedWorld` (the planner) lifts the time budget only: a predicted layout's time is what it measures.
"""

from __future__ import annotations

from engine.loop.sim.scenario import Scenario


def time_bound(s: Scenario) -> float:
    """Simulated time within which the scenario must end: its work done strictly serially (every request
    alone, every step, sync and validation in turn), plus the operator's pauses and the faults, times 4."""
    tokens = (s.total_prompts * s.n + (s.val_prompts * (s.total_prompts + 1))) * s.max_new_tokens
    gen = tokens * s.token_cost * (5 if s.straggler is not None else 1)
    train = s.total_prompts * s.n * s.max_new_tokens * s.train_token_cost
    syncs = (s.total_prompts + 1) * (s.sync_cost + s.token_cost)
    tools = 0.0
    if s.multi_turn:  # at worst every token a turn of its own, each followed by the slowest tool call, serially
        slowest = s.tool_timeout if s.tool_timeout is not None else 20 * 1.5 * s.tool_latency
        tools = s.total_prompts * s.n * s.max_new_tokens * (slowest + s.token_cost * (5 if s.straggler is not None else 1))
    last_action = max([a.at for a in s.actions] + s.replica_deaths + s.trainer_deaths + [0.0])
    return 4 * (gen + train + syncs + tools) * (1 + len(s.trainer_deaths)) + last_action + 10.0


def _steps(s: Scenario) -> int:
    """The run's local steps (`World`'s `total_local_steps`)."""
    return max(1, s.loop().trainer.total_local_steps)


def _turns(s: Scenario) -> int:
    """Model turns of one trajectory at most: 1 single-turn; multi-turn, every turn but the last has ≥ 1 model
    token and is followed by a tool answer of ≥ 1 token within the response budget."""
    if not s.multi_turn:
        return 1
    turns = s.max_new_tokens // 2 + 1
    return min(turns, s.max_assistant_turns + 1) if s.max_assistant_turns else turns


def event_bound(s: Scenario) -> int:
    """Events within which the scenario must end. With P prompts, S local steps (`_steps`), V = S + 2 validations
    at most (one per version, before training and at the end), `turns` (`_turns`) and `rows` = the rows of all
    replicas (what can be out at once):
    - a request segment is a model turn of a trajectory or validation answer, or what is left of one after an
      abort; segments ≤ (P · n + val_prompts · V) · turns + rows · (aborting moments + replica deaths), where an
      aborting moment — a sync (≤ S + 1), an on-demand checkpoint, a stop, the final cut — aborts at most `rows`
      segments, and a death loses at most `rows`;
    - a dispatch carries ≥ 1 segment and ends in one generation event, or two when aborted (its first completion
      is then stale); tool answers ≤ one per model turn; trained ≤ S; synced ≤ S + 1;
    - elastic cores: each of those may flip a role's computing state, each flip ≤ `replicas` thread events;
    - a trainer death may redo all of it; plus one event per action, death and restart.
    The budget is twice that, plus 100."""
    steps = _steps(s)
    rows = sum(c.rows for c in s.capacities())
    cuts = steps + 2 + sum(a.name in ("checkpoint", "stop") for a in s.actions)
    trajectories = (s.total_prompts * s.n + s.val_prompts * (steps + 2)) * _turns(s)
    segments = trajectories + rows * (cuts + len(s.replica_deaths))
    work = 2 * segments + (trajectories if s.multi_turn else 0) + 2 * steps + 1
    if s.elastic_cores:
        work *= 1 + 2 * s.replicas
    fixed = len(s.actions) + 2 * len(s.replica_deaths) + len(s.trainer_deaths)
    return 2 * (work * (1 + len(s.trainer_deaths)) + fixed) + 100


def stall_bound(s: Scenario) -> int:
    """Events in a row without progress of the training work (a model token or tool answer of it returned, a
    prompt admitted, queued, trained or dropped, a resume: `World._progress`) within which a correct run
    progresses again. Between two progress marks only these can happen:
    - at most two syncs (one owed by a knob change, one after a step whose trained event was the last mark);
    - stale completions: a dispatch aborted at an aborting moment (those two syncs, an on-demand checkpoint, a
      stop, the final cut) or lost with a dead replica completes once more, stale — ≤ `calls` (the calls of
      all replicas) per moment and per death;
    - at most three validations (after those syncs and the final one), each ≤ val_prompts · turns dispatches,
      each completed once and answered once by its tools (multi-turn), plus ≤ `calls` aborted at a stop;
    - after a trainer death, the stale tool answers and trained event of the dead run (≤ P · n + 1);
    - every action, death and restart;
    - with elastic cores each of those may flip a role, each flip ≤ `replicas` thread events.
    The budget is four times that, plus 50."""
    calls = sum(c.calls for c in s.capacities())
    deaths = len(s.replica_deaths) + len(s.trainer_deaths)
    moments = 2 + sum(a.name in ("checkpoint", "stop") for a in s.actions) + 1
    validation = 3 * s.val_prompts * _turns(s) * (2 if s.multi_turn else 1) + calls
    stale_run = (s.total_prompts * s.n + 1) * len(s.trainer_deaths)
    quiet = 2 + calls * (moments + deaths) + validation + stale_run + len(s.actions) + 2 * deaths
    if s.elastic_cores:
        quiet *= 1 + 2 * s.replicas
    return 4 * quiet + 50
