"""One simulated run: the real `RolloutLoop` and `TrainerLoop` and the real control plane (`ControllerCore`,
with the knob router `engine.loop.knobs`), with simulated replicas, queue, training and faults, in simulated
time from one seed. Both shells here only execute the cores' commands, as the Ray actors do: the trainer's
sequence (pull, drop, train, sync decision, sync, checkpoint cut, stop, end) is `TrainerLoop`'s alone.

Replicas (`engine.loop.sim.replicas`) take several dispatches at once up to their drawn capacity; each
generates in `max(remaining tokens) × token_cost`; an abort returns at the next token boundary with the
tokens generated so far. With `elastic_cores` the world runs the real `ElasticCores` core (`engine.loop.elastic`):
the trainer reports a wait before every `Pull` and a step before every `Train` (taking the threads granted at
that step boundary), the rollout whether a dispatch is out after every tick; a replica takes a `SetThreads` at
its next decode step (`replica cost` later while it generates, at once when idle). A training step takes its tokens ×
`train_token_cost`, a sync `sync_cost`. A checkpoint is a copy of both cores' checkpoint state, the queue,
the trainer's buffer and the ledger's length, cut as the rollouter cuts it: at a sync while the rollout side
is paused (periodic), else under `begin_hold` with the running generations drained (on demand, stop, final);
a trainer death resumes from the last one (or from scratch).
Everything is drawn from the scenario's seed, so a run replays exactly. A run ends, or is reported as a
deadlock (no event left) or a livelock (a budget of `engine.loop.sim.bounds` spent), never hangs.
"""

from __future__ import annotations

import heapq
import pickle
import random
from dataclasses import dataclass
from typing import Any

from engine.control.core import ControllerCore
from engine.loop.commands import (
    Abort, AckKnob, CallTools, CloseQueue, Command, Dispatch, Event, NeedPrompts, Put, ReleaseTools, Resume,
    SetQueueBound, SetThreads, ValidationDone,
)
from engine.loop.elastic import ROLLOUT as E_ROLLOUT, TRAINER as E_TRAINER, ElasticCores, ElasticParams
from engine.loop.knobs import ROLLOUTER, TRAINER
from engine.loop.rollout import RolloutLoop
from engine.loop.sim.checks import Checker
from engine.loop.sim.replicas import SimReplica, SimReplicas
from engine.loop.sim.bounds import event_bound, stall_bound, time_bound
from engine.loop.sim.scenario import Scenario
from engine.loop.sim.tools import SimTools
from engine.loop.sim.trainer_shell import SimTrainer
from engine.loop.trainer import TrainerLoop
from engine.loop.stream import PromptStream
from engine.types import Prompt, TrajectoryGroup

RESTART_DELAY = 1.0


def _snapshot(state: Any) -> Any:
    """A deep copy of checkpointed state, made as a real checkpoint is: serialized and read back (a pickle round
    trip — several times faster than `copy.deepcopy` on these plain containers)."""
    return pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


@dataclass
class Outcome:
    """What a simulated run reports."""

    seed: int
    finished: bool
    failure: str | None
    sim_time: float
    steps: int
    versions: int
    staleness: list[int]
    violations: list[str]
    trainer_busy_s: float
    rollout_busy_s: float
    events: int
    records: list[tuple[int, int]]
    """(local step, version) of every step record, as a real run's metrics.jsonl has them."""
    multi_turn: bool = False
    tool_answers: int = 0
    """Multi-turn: the tool answers appended, and the syncs that happened while a tool call was out."""
    syncs_during_tools: int = 0

    @property
    def trainer_idle_ratio(self) -> float:
        return 1.0 - self.trainer_busy_s / self.sim_time if self.sim_time else 0.0


def _prompt(epoch: int, i: int) -> Prompt:
    return Prompt(uid=f"p{epoch}-{i}", index=i, epoch=epoch, prompt_ids=[1, 2, 3])


class World(SimTrainer, SimReplicas, SimTools):
    """Runs one scenario (see the module docstring); `run()` returns an `Outcome`."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.rng = random.Random(s.seed * 7919 + 1)
        self.now = 0.0
        self.heap: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.bound, self.event_bound, self.stall_bound = time_bound(s), event_bound(s), stall_bound(s)
        self.halted = False  # a budget was spent (`livelock`)
        self.loop = s.loop()  # the run's own construction from the scenario's config values
        self.rp, self.tp = self.loop.rollout, self.loop.trainer
        self.tool_rng = random.Random(s.seed * 104729 + 3)
        self.reward_rng = random.Random(s.seed * 15485863 + 5)  # rewards matter only with dynamic sampling
        self.tool_waits: dict[tuple[str, int], float] = {}
        self.tool_sessions: set[tuple[str, int, bool]] = set()
        self.answers: dict[int, tuple[str, int, int]] = {}
        self.controller = ControllerCore(f"sim-{s.seed}", sinks=[], clock=lambda: self.now, config={
            "async_training": {"trigger_parameter_sync_step": s.trigger, "staleness_threshold": s.staleness_threshold}})
        self.val = [Prompt(uid=f"v{i}", index=i, epoch=0, prompt_ids=[4, 5]) for i in range(s.val_prompts)]
        self.check = Checker(s, self)
        self.capacities = s.capacities()
        self.replicas = [SimReplica(cost=s.token_cost * (5 if i == s.straggler else 1), rows=c.rows, calls=c.calls)
                         for i, c in enumerate(self.capacities)]
        self.restarts = 0
        self.ledger: list[tuple[str, str]] = []  # (uid, outcome)
        self.checkpoint: dict[str, Any] | None = None
        self.trainer_state = "running"  # running | final_val | done
        self.waiting: Command | None = None  # the trainer core's command that waits for an outcome
        self._loading = False
        self._cut: dict[str, Any] | None = None  # the rollout side, snapshot at a sync with `cut`
        self._control_dirty = False  # a knob or action arrived since the trainer last polled
        self.failure: str | None = None
        self.done = False
        self.trainer_busy = 0.0
        self.rollout_busy = 0.0
        self.staleness: list[int] = []
        self.records: list[tuple[int, int]] = []
        self.steps_seen = 0
        self.events = 0
        self._new_run(None)
        for a in s.actions:
            self._at(a.at, "action", (a.name, a.value))
        for t in s.replica_deaths:
            self._at(t, "replica_death", ())
        for t in s.trainer_deaths:
            self._at(t, "trainer_death", ())

    # ------------------------------------------------------------------ setup and resume
    def _new_run(self, ckpt: dict[str, Any] | None) -> None:
        stream = PromptStream(1, self.s.total_prompts)
        self.rollout = RolloutLoop(self.rp, stream, self.val, len(self.replicas), list(self.capacities))
        self.trainer = TrainerLoop(self.tp)
        self.inbox = {TRAINER: self.trainer.inbox(), ROLLOUTER: self.rollout.inbox()}
        self.waiting, self._loading, self._cut = None, False, None
        self.tool_waits = {}  # a resumed conversation generates its last turn again (`engine.loop.inflight`)
        self.tool_sessions = set()  # the rollouter's process (and its tools' boxes) is gone
        self.queue: list[TrajectoryGroup] = []
        self.queue_closed = False
        self.run_epoch = getattr(self, "run_epoch", 0) + 1
        for r in self.replicas:
            r.reset()
        self.rollout.live = {i for i, r in enumerate(self.replicas) if r.alive}
        self.elastic = ElasticCores(ElasticParams(self.s.trainer_threads, self.s.replica_threads, 1,
                                                  len(self.replicas), self.s.elastic_cores))
        self.trainer_grant = self.trainer_threads = self.elastic.granted[E_TRAINER]  # granted; applied by the step
        self.training_until: float | None = None  # the end of the step being trained (None: not training)
        for r in self.replicas:
            r.threads = r.want_threads = self.elastic.granted[E_ROLLOUT]
        if ckpt is None:
            self.ledger = []
            if self.s.val_before_train and self.val:
                self.rollout.queue_validation(0)
            for r in self.replicas:
                r.version = 0
        else:
            self.trainer.restore(ckpt["trainer"])
            self.trainer.buffer = _snapshot(ckpt["buffer"])
            self.rollout.restore_state(_snapshot(ckpt["rollout"]["rollout"]),
                                       _snapshot(ckpt["rollout"]["in_flight"]), self.now)
            self.queue = _snapshot(ckpt["queue"])
            self.rollout.queue_seen(len(self.queue))
            del self.ledger[ckpt["ledger"]:]
            for r in self.replicas:
                r.version = self.trainer.version
        self._poll_rollout_knobs()  # a restarted rollouter re-reads the knobs in force
        self.queue_bound = self.rollout.queue_bound
        self.trainer_state = "running"
        self._control_dirty = True  # a resumed trainer reads the knob table first
        self.check.on_resume(self.trainer.trigger)

    def _rollout_cut(self) -> dict[str, Any]:
        return {"rollout": self.rollout.snapshot_state(), "queue": list(self.queue)}

    def _take_checkpoint(self, cut: dict[str, Any], last: bool = False) -> None:
        """`last`: the run's final or stop checkpoint, which no resume uses (kept uncopied)."""
        ckpt = {"trainer": self.trainer.state(), "buffer": list(self.trainer.buffer), "rollout": cut["rollout"],
                "queue": cut["queue"], "ledger": len(self.ledger)}
        self.checkpoint = ckpt if last else _snapshot(ckpt)
        self.check.on_checkpoint(self.checkpoint)

    # ------------------------------------------------------------------ event loop
    def _at(self, t: float, kind: str, args: tuple) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, args))

    def run(self) -> Outcome:
        """Pop events until the run is over, no event is left (a deadlock) or a budget is spent (a livelock:
        `engine.loop.sim.bounds`)."""
        self._trainer_run(self.trainer.start())
        self._kick()
        handlers: dict[str, Any] = {}  # event kind -> this world's bound `_on_<kind>`
        mark, stall = self._progress(), 0
        while not self.done and not self.halted and self.heap:
            t, _, kind, args = heapq.heappop(self.heap)
            if t > self.bound or self.events >= self.event_bound:
                budget = f"its simulated-time budget t={self.bound:.1f}s" if t > self.bound else \
                    f"its event budget ({self.event_bound} events) at t={self.now:.2f}s"
                self.livelock(f"not finished within {budget}")
                break
            self.now = t
            self.events += 1
            on = handlers.get(kind)
            if on is None:
                on = handlers[kind] = getattr(self, f"_on_{kind}")
            on(*args)
            self._kick()
            self.check.on_threads()
            now = self._progress()
            stall = 0 if now != mark else stall + 1
            mark = now
            if stall > self.stall_bound:
                self.livelock(f"{stall} events in a row without progress (stall budget {self.stall_bound}) at "
                              f"t={self.now:.2f}s")
        if not self.done and not self.halted and not self.check.violations:
            self.check.violation("deadlock", f"no event can happen and the run is not over: {self.describe()}")
        if self.done and not self.halted:
            self.check.at_end()
        return Outcome(self.s.seed, self.done and self.failure is None and not self.halted, self.failure,
                       self.now, self.trainer.local_step, self.trainer.version, self.staleness, self.check.violations,
                       self.trainer_busy, self.rollout_busy, self.events, self.records, self.s.multi_turn,
                       len(self.answers), self.check.syncs_during_tools)

    def livelock(self, why: str) -> None:
        """A budget is spent: report it with the last state of every core, and stop the run here."""
        self.check.violation("livelock", f"{why}: {self.describe()}")
        self.halted = True

    def _progress(self) -> tuple:
        """Changes whenever the training work progresses: a model token or tool answer of it returned, a prompt
        admitted, queued, trained or dropped, a resume (validation is bounded per progress mark:
        `engine.loop.sim.bounds.stall_bound`)."""
        ro, tr = self.rollout, self.trainer
        return (self.tokens_out, self.train_answers, ro.total_generated, ro.stream.emitted, tr.local_step,
                len(self.ledger), len(ro.dropped), self.run_epoch)

    def describe(self) -> str:
        """The last state of every core: the trainer's, the rollout's, the knobs pending in the controller's
        table and (with elastic cores) the threads granted."""
        ro, tr = self.rollout, self.trainer
        pending = {k: v["value"] for k, v in self.controller.get_knobs().items()
                   if v.get("applied_version", 0) < v["version"]}
        return (f"trainer={self.trainer_state} waiting={type(self.waiting).__name__} step={tr.local_step}/"
                f"{tr.p.total_local_steps} v={tr.version} since_sync={tr.since_sync} trigger={tr.trigger} "
                f"buffer={len(tr.buffer)} want={tr.want()} stopping={tr.stopping} | "
                f"rollout v={ro.version} in_flight={len(ro.in_flight)} running={sorted(ro.running)} "
                f"aborted={sorted(ro.aborted)} live={sorted(ro.live)} "
                f"budget={ro.budget.staleness_samples}/{ro.budget.limit}+{ro.budget.extra} trigger={ro.budget.trigger} "
                f"queue={len(self.queue)}/{self.queue_bound} sync={ro.sync} paused={ro.paused} hold={ro.hold} "
                f"closed={ro.closed} emitted={ro.stream.emitted}/{ro.stream.total} val_pending={len(ro.val_pending)} | "
                f"knobs pending={pending}" + (f" | elastic granted={self.elastic.granted}" if self.elastic.p.enabled
                                              else ""))

    def _kick(self) -> None:
        """Let both shells act until neither has anything left to do at this instant."""
        for _ in range(1000):
            if self.done or self.halted:
                return
            before = self.rollout.stream.emitted
            cmds = self.rollout.tick(self.now)
            self._execute(cmds)
            if self.rollout.stream.emitted > before:
                self.check.on_admit(self.rollout.budget)
            self._execute(self.elastic.rollout(bool(self.rollout.dispatches)))
            if not self._trainer_progress() and not cmds:
                return
        self.livelock(f"1000 actions at one instant t={self.now:.2f}s")

    # ------------------------------------------------------------------ the rollout shell
    def _execute(self, cmds: list) -> None:
        for c in cmds:
            if isinstance(c, Dispatch):
                self._start(c.replica, c.dispatch_id, c.kind, list(c.requests))
            elif isinstance(c, Abort):
                for rid in c.replicas:
                    self._abort(rid, c.validation)
            elif isinstance(c, Resume):
                for rid in c.replicas:
                    self._resume(rid)
            elif isinstance(c, Put):
                self.check.on_put_tools(c.prompt.uid)
                group = TrajectoryGroup(c.prompt, list(c.trajectories), admitted_version=c.admitted_version)
                if self.s.filter_groups:  # the scorer: all alike with probability uniform_p, else 0/1 at random
                    flat = self.reward_rng.random() < self.s.uniform_p
                    for i, t in enumerate(group.trajectories):
                        t.reward = 0.0 if flat else float(i % 2 if i < 2 else self.reward_rng.random() < 0.5)
                evicted = None
                if len(self.queue) >= self.queue_bound:
                    evicted = self.queue.pop(0).prompt.uid
                    self.check.violation("queue_overflow", f"queue bound {self.queue_bound} reached: "
                                         f"evicted {evicted}")
                self.queue.append(group)
                self._execute(self.rollout.group_put(evicted))
            elif isinstance(c, CloseQueue):
                self.queue_closed = True
            elif isinstance(c, SetQueueBound):
                self.queue_bound = c.size
            elif isinstance(c, ValidationDone):
                self.check.on_validation(c)
                if self.trainer_state == "final_val" and c.version == self.trainer.version:
                    self._end_run()
            elif isinstance(c, NeedPrompts):
                self._execute(self.rollout.prompts_loaded(c.epoch, [_prompt(c.epoch, i)
                                                                    for i in range(self.s.total_prompts)]))
            elif isinstance(c, AckKnob):
                self._ack(c)
            elif isinstance(c, CallTools):
                self._call_tools(c)
            elif isinstance(c, ReleaseTools):
                self._release_tools(c)
            elif isinstance(c, SetThreads):
                self._set_threads(c)
            elif isinstance(c, Event):
                if c.kind == "knob" and "refused" in c.message:
                    self.check.on_knob_refused(c.extra.get("knob"))

    def _set_threads(self, c: SetThreads) -> None:
        """The trainer takes its threads at its next step; a generating replica at its next decode step, an idle
        one when it next starts (`_on_threads`)."""
        if c.role == E_TRAINER:
            self.trainer_grant = c.threads
            return
        for rid, rep in enumerate(self.replicas):
            rep.want_threads = c.threads
            if rep.dispatches:
                rep.threads_due = self.now + rep.cost  # its next decode step
                self._at(rep.threads_due, "threads", (self.run_epoch, rid, c.threads))
            else:
                rep.threads = c.threads

    def _on_threads(self, run_epoch: int, rid: int, n: int) -> None:
        rep = self.replicas[rid]
        if run_epoch == self.run_epoch and rep.want_threads == n:
            rep.threads = n

    def threads_in_use(self) -> tuple[int, int, float | None]:
        """(threads computing now as applied, the same counting only what the core grants now, the latest end of
        a window in which a borrower still runs with threads it gave back: its next boundary)."""
        used = bounded = 0
        ends: list[float] = []
        if self.training_until is not None:
            used += self.trainer_threads
            bounded += min(self.trainer_threads, self.elastic.granted[E_TRAINER])
            if self.trainer_threads > self.elastic.granted[E_TRAINER]:
                ends.append(self.training_until)
        for rep in self.replicas:
            if rep.alive and rep.dispatches:
                used += rep.threads
                bounded += min(rep.threads, rep.want_threads)
                if rep.threads > rep.want_threads:
                    ends.append(rep.threads_due)
        return used, bounded, max(ends) if ends else None

    # ------------------------------------------------------------------ faults and the operator
    def _on_replica_death(self) -> None:
        alive = [i for i, r in enumerate(self.replicas) if r.alive]
        if not alive:
            return
        rid = self.rng.choice(alive)
        rep = self.replicas[rid]
        rep.alive = False
        rep.reset()
        self._execute(self.rollout.replica_died(rid))
        if self.restarts >= self.s.max_replica_restarts:
            self._fail(f"rollout replica {rid} died and the restart budget ({self.s.max_replica_restarts}) is spent")
            return
        self.restarts += 1
        self._at(self.now + RESTART_DELAY, "replica_up", (rid,))

    def _on_replica_up(self, rid: int) -> None:
        rep = self.replicas[rid]
        rep.alive, rep.version = True, self.trainer.version  # the newest weights pushed so far
        self._execute(self.rollout.replica_up(rid))

    def _on_trainer_death(self) -> None:
        if self.trainer_state == "done":
            return
        self.check.on_trainer_death(self.checkpoint)
        self._new_run(self.checkpoint)
        self._trainer_run(self.trainer.start())

    def _on_action(self, name: str, value: Any) -> None:
        """The operator, through the real controller: a knob change or a one-shot action."""
        self.check.on_action(name, value, self.now)
        if name in ("checkpoint", "stop"):
            self.controller.request_action(name, who="sim")
        else:
            if self.controller.set_knob(name, value, who="sim")["reason"].startswith("unchanged"):
                self.check.on_knob_applied(name, value)  # the value asked for is the one in force
            self._poll_rollout_knobs()  # the rollouter applies its knobs at once
        self._control_dirty = True

    def _poll_rollout_knobs(self) -> None:
        for k in self.inbox[ROLLOUTER].take(self.controller.get_knobs()):
            self._execute(self.rollout.knob(k))

    def _ack(self, c: AckKnob) -> None:
        self.controller.ack_knob(c.name, c.version, self.trainer.local_step)
        self.check.on_knob_applied(c.name, self.controller.get_knobs()[c.name]["applied_value"])
        self._poll_rollout_knobs()  # a follower takes the applied value (the Ray rollouter: at its next poll)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self._execute(self.rollout.stop())
        self.done = True
