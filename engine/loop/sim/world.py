"""One simulated run: the real `RolloutLoop` and `TrainerLoop`, with simulated replicas, queue, trainer,
operator and faults, in simulated time from one seed.

Replicas (`engine.loop.sim.replicas`) take several dispatches at once up to their drawn capacity; each
generates in `max(remaining tokens) × token_cost`; an abort returns at the next token boundary with the
tokens generated so far. A training step takes its tokens ×
`train_token_cost`, a sync `sync_cost`. A checkpoint is a copy of both cores' checkpoint state, the queue,
the trainer's buffer and the ledger's length; a trainer death resumes from the last one (or from scratch).
Everything is drawn from the scenario's seed, so a run replays exactly.
"""

from __future__ import annotations

import copy
import heapq
import random
from dataclasses import dataclass
from typing import Any

from engine.loop.commands import (
    Abort, CloseQueue, Dispatch, Event, Put, Resume, SetQueueBound, ValidationDone,
)
from engine.loop.rollout import RolloutLoop, RolloutParams
from engine.loop.sim.checks import Checker
from engine.loop.sim.replicas import SimReplica, SimReplicas
from engine.loop.sim.scenario import Scenario, time_bound
from engine.loop.trainer import TrainerLoop, TrainerParams, staleness_of
from engine.loop.stream import PromptStream
from engine.types import Prompt, TrajectoryGroup

RESTART_DELAY = 1.0


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

    @property
    def trainer_idle_ratio(self) -> float:
        return 1.0 - self.trainer_busy_s / self.sim_time if self.sim_time else 0.0


def _prompt(epoch: int, i: int) -> Prompt:
    return Prompt(uid=f"p{epoch}-{i}", index=i, epoch=epoch, prompt_ids=[1, 2, 3])


class World(SimReplicas):
    """Runs one scenario (see the module docstring); `run()` returns an `Outcome`."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.rng = random.Random(s.seed * 7919 + 1)
        self.now = 0.0
        self.heap: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.bound = time_bound(s)
        sync = s.mode == "sync"
        self.rp = RolloutParams(n=s.n, max_new_tokens=s.max_new_tokens, required_samples=s.required_samples,
                                staleness_threshold=0.0 if sync else s.staleness_threshold, trigger=s.trigger,
                                partial_rollout=s.partial_rollout and not sync, seqs_per_call=s.seqs_per_call,
                                test_freq=s.test_freq, sync_mode=sync)
        cycle = s.required_samples * s.trigger
        total_local = max(1, s.total_prompts // cycle) * s.trigger
        self.tp = TrainerParams(s.required_samples, s.trigger, total_local, sync, s.max_staleness_versions,
                                s.stale_policy, s.checkpoint_every_versions)
        self.val = [Prompt(uid=f"v{i}", index=i, epoch=0, prompt_ids=[4, 5]) for i in range(s.val_prompts)]
        self.check = Checker(s, self)
        self.capacities = s.capacities()
        self.replicas = [SimReplica(cost=s.token_cost * (5 if i == s.straggler else 1), rows=c.rows, calls=c.calls)
                         for i, c in enumerate(self.capacities)]
        self.restarts = 0
        self.ledger: list[tuple[str, str]] = []  # (uid, outcome)
        self.checkpoint: dict[str, Any] | None = None
        self.knobs: dict[str, Any] = {}  # desired values not yet applied by the trainer
        self.pending_actions: list[str] = []
        self.trainer_state = "idle"  # idle | training | syncing | final_val | done
        self.failure: str | None = None
        self.done = False
        self.stopped = False
        self.trainer_busy = 0.0
        self.rollout_busy = 0.0
        self.staleness: list[int] = []
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
        stream = PromptStream(lambda e: [_prompt(e, i) for i in range(self.s.total_prompts)], 1,
                              self.s.total_prompts)
        self.rollout = RolloutLoop(self.rp, stream, self.val, len(self.replicas), list(self.capacities))
        self.trainer = TrainerLoop(self.tp)
        self.queue: list[TrajectoryGroup] = []
        self.queue_closed = False
        self.run_epoch = getattr(self, "run_epoch", 0) + 1
        for r in self.replicas:
            r.reset()
        self.rollout.live = {i for i, r in enumerate(self.replicas) if r.alive}
        if ckpt is None:
            self.ledger = []
            if self.s.val_before_train and self.val:
                self.rollout.queue_validation(0)
            for r in self.replicas:
                r.version = 0
        else:
            self.trainer.restore(ckpt["trainer"])
            self.trainer.buffer = copy.deepcopy(ckpt["buffer"])
            self.rollout.restore_state(copy.deepcopy(ckpt["rollout"]["rollout"]),
                                       copy.deepcopy(ckpt["rollout"]["in_flight"]), self.now)
            self.queue = copy.deepcopy(ckpt["queue"])
            self.rollout.queue_seen(len(self.queue))
            del self.ledger[ckpt["ledger"]:]
            for r in self.replicas:
                r.version = self.trainer.version
        self.queue_bound = self.rollout.queue_bound
        self.trainer_state = "idle"
        self.check.on_resume(self.trainer.trigger)

    def _take_checkpoint(self) -> None:
        snap = self.rollout.snapshot_state()
        self.checkpoint = copy.deepcopy({"trainer": self.trainer.state(), "buffer": self.trainer.buffer,
                                         "rollout": snap, "queue": self.queue, "ledger": len(self.ledger)})
        self.check.on_checkpoint(self.checkpoint)

    # ------------------------------------------------------------------ event loop
    def _at(self, t: float, kind: str, args: tuple) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, args))

    def run(self) -> Outcome:
        self._kick()
        while not self.done and self.heap:
            t, _, kind, args = heapq.heappop(self.heap)
            if t > self.bound:
                self.check.violation("liveness", f"not finished by t={self.bound:.1f} (simulated s): "
                                     f"{self.describe()}")
                break
            self.now = t
            self.events += 1
            getattr(self, f"_on_{kind}")(*args)
            self._kick()
        if not self.done and not self.check.violations:
            self.check.violation("deadlock", f"no event can happen and the run is not over: {self.describe()}")
        if self.done:
            self.check.at_end()
        return Outcome(self.s.seed, self.done and self.failure is None, self.failure, self.now,
                       self.trainer.local_step, self.trainer.version, self.staleness, self.check.violations,
                       self.trainer_busy, self.rollout_busy, self.events)

    def describe(self) -> str:
        ro, tr = self.rollout, self.trainer
        return (f"trainer={self.trainer_state} step={tr.local_step}/{tr.p.total_local_steps} v={tr.version} "
                f"since_sync={tr.since_sync} trigger={tr.trigger} buffer={len(tr.buffer)} want={tr.want()} | "
                f"rollout in_flight={len(ro.in_flight)} running={sorted(ro.running)} aborted={sorted(ro.aborted)} "
                f"live={sorted(ro.live)} budget={ro.budget.staleness_samples}/{ro.budget.limit}+{ro.budget.extra} "
                f"queue={len(self.queue)}/{self.queue_bound} sync={ro.sync} paused={ro.paused} "
                f"closed={ro.closed} emitted={ro.stream.emitted}/{ro.stream.total} val_pending={len(ro.val_pending)}")

    def _kick(self) -> None:
        """Let both shells act until neither has anything left to do at this instant."""
        for _ in range(1000):
            if self.done:
                return
            before = self.rollout.stream.emitted
            cmds = self.rollout.tick(self.now)
            if self.rollout.stream.emitted > before:
                self.check.on_admit(self.rollout.budget)
            self._execute(cmds)
            if not self._trainer_progress() and not cmds:
                return
        self.check.violation("livelock", f"1000 actions at one instant: {self.describe()}")
        self.done = True

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
                group = TrajectoryGroup(c.prompt, list(c.trajectories), admitted_version=c.admitted_version)
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
            elif isinstance(c, Event):
                pass

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
        self.check.on_trainer_death()
        self._new_run(self.checkpoint)

    def _on_action(self, name: str, value: Any) -> None:
        self.check.on_action(name, value, self.now)
        if name == "trigger_parameter_sync_step":
            self.knobs[name] = value
        elif name == "staleness_threshold":
            self._execute(self.rollout.set_staleness(value))
            self.check.on_knob_applied(name, value)
        elif name == "paused":
            self.rollout.set_paused(value)
            self.check.on_knob_applied(name, value)
        else:
            self.pending_actions.append(name)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self._execute(self.rollout.stop())
        self.done = True

    # ------------------------------------------------------------------ the trainer shell
    def _apply_trigger(self, at_sync: bool) -> None:
        if "trigger_parameter_sync_step" in self.knobs and self.trainer.can_take_trigger(at_sync):
            value = self.knobs.pop("trigger_parameter_sync_step")
            self.trainer.set_trigger(value)
            self._execute(self.rollout.set_trigger(value))
            self.check.on_knob_applied("trigger_parameter_sync_step", value)

    def _boundary(self) -> bool:
        """A local-step boundary: apply the sync interval, take the operator's actions. True when a sync
        (made due by a lowered interval) started."""
        self._apply_trigger(at_sync=False)
        actions, self.pending_actions = self.pending_actions, []
        for a in actions:
            if a == "checkpoint":
                self._take_checkpoint()
            elif a == "stop":
                self.stopped = True
                self.trainer.stop()
        if self.trainer.sync_owed() and not self.trainer.finished():
            return self._after_step()
        return False

    def _trainer_progress(self) -> bool:
        """Advance the trainer if it can; True if anything changed."""
        tr = self.trainer
        if self.trainer_state == "syncing":
            if self.rollout.sync_ready() and not getattr(self, "_loading", False):
                self._loading = True
                self._at(self.now + self.s.sync_cost, "synced", (self.run_epoch,))
            return False
        if self.trainer_state != "idle":
            return False
        if self._boundary():
            return True
        if tr.finished():
            return self._finish_training()
        want = tr.want()
        if want and not tr.can_step():
            if len(self.queue) >= want or self.queue_closed:
                got, self.queue = self.queue[:want], self.queue[want:]
                was_closed = tr.closed
                tr.offer(got, self.queue_closed and not self.queue)
                self.rollout.queue_seen(len(self.queue))
                if not got and not tr.can_step():
                    return tr.closed != was_closed
            else:
                return False
        if not tr.can_step():
            return False
        keep, drop = tr.take_batch()
        if drop:
            uids = [g.prompt.uid for g in drop]
            self.ledger += [(u, "dropped") for u in uids]
            self.rollout.release(uids, "stale")
        if not keep:
            return True
        for g in keep:
            st = staleness_of(g, tr.version)
            self.staleness.append(st)
            self.check.on_trained(g, st)
        cost = sum(len(t.response_ids) for g in keep for t in g.trajectories) * self.s.train_token_cost
        self.trainer_busy += cost
        self.trainer_state = "training"
        self._at(self.now + cost, "trained", (self.run_epoch, [g.prompt.uid for g in keep]))
        return True

    def _on_trained(self, run_epoch: int, uids: list[str]) -> None:
        if run_epoch != self.run_epoch:
            return
        tr = self.trainer
        self.ledger += [(u, "trained") for u in uids]
        tr.step_done()
        self._after_step()

    def _after_step(self) -> bool:
        """Ask the trainer loop whether to sync now; start the sync (True) or go back to pulling."""
        tr = self.trainer
        queue_min = min((g.min_version for g in self.queue), default=None)
        outstanding = [v for v in (self.rollout.outstanding_min_version(), queue_min) if v is not None]
        decision = tr.sync_decision(min(outstanding, default=None))
        self.check.on_step(tr, decision)
        if decision.action == "sync":
            self.trainer_state = "syncing"
            self._loading = False
            self._execute(self.rollout.begin_sync(tr.version + 1, tr.local_step))
            return True
        if decision.action == "postpone":
            self._execute(self.rollout.allow(decision.need))
        self.trainer_state = "idle"
        return False

    def _on_synced(self, run_epoch: int) -> None:
        if run_epoch != self.run_epoch:
            return
        tr = self.trainer
        self._loading = False
        version = tr.version + 1
        for r in self.replicas:
            if r.alive:
                r.version = version
        self.trainer_busy += self.s.sync_cost
        tr.synced()
        self._apply_trigger(at_sync=True)
        self._execute(self.rollout.finish_sync(version, tr.local_step))
        self.check.on_sync(tr)
        if tr.checkpoint_due():
            self._take_checkpoint()
        self.trainer_state = "idle"

    def _finish_training(self) -> bool:
        if not self.stopped and self.s.test_freq and self.rollout.request_final_validation(self.trainer.version):
            if self.rollout.validated_version == self.trainer.version:
                self._end_run()
            else:
                self.trainer_state = "final_val"
            return True
        self._end_run()
        return True

    def _end_run(self) -> None:
        self._execute(self.rollout.stop())
        left = list(self.rollout.in_flight) + [g.prompt.uid for g in self.queue + self.trainer.buffer]
        self.ledger += [(u, "in_flight_at_end") for u in left]
        self.ledger += [(u, f"dropped:{why}") for u, why in self.rollout.dropped]
        self.trainer_state = "done"
        self.done = True
