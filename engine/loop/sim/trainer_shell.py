"""The simulator's trainer shell: carries out `TrainerLoop`'s commands as `engine.runtime.trainer_actor` does
(a mixin of `World`: uses `trainer`, `rollout`, `queue`, `ledger`, `elastic`, `check`, `_at`, `_execute`,
`_take_checkpoint`, …). A command that waits for an outcome is kept in `waiting` until the outcome comes: a
pull until the queue has groups (or closes, or a knob or action arrived), a training step until its cost has
elapsed (`trained`), a sync until the rollout side is ready and the load has taken `sync_cost` (`synced`), a
checkpoint cut until the running generations are drained. The shell decides nothing: the sequence is the core's.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from engine.loop.commands import (
    AckKnob, Allow, AskOutstanding, Checkpoint, Drop, Event, Finish, PollControl, Pull, Record,
    Sync, Train,
)
from engine.loop.knobs import TRAINER
from engine.loop.trainer import staleness_of

TRAINER_RUN_LIMIT = 10_000
"""Commands the trainer core may answer in one go without waiting on an outcome; more is a livelock."""


class SimTrainer:
    """The trainer side of `World` (see the module docstring)."""

    def _trainer_run(self, cmds: list) -> None:
        """Carry out the trainer core's commands in order; one that waits for an outcome is kept in `waiting`
        (`_trainer_progress` reports its outcome when it comes)."""
        todo, done = deque(cmds), 0
        while todo and not self.done and not self.halted:
            c = todo.popleft()
            done += 1
            if done > TRAINER_RUN_LIMIT:
                self.livelock(f"the trainer core answered {TRAINER_RUN_LIMIT} commands at t={self.now:.2f}s "
                              "without waiting on anything")
                return
            more = self._trainer_do(c)
            if more is None:
                self.waiting = c
                return
            todo.extend(more)

    def _trainer_do(self, c: Any) -> list | None:
        """One trainer command: its follow-up commands, or None while it waits."""
        tr = self.trainer
        if isinstance(c, PollControl):
            self._control_dirty = False
            self._threshold_polled = self.rollout.budget.staleness_threshold
            return tr.control(self.inbox[TRAINER].take(self.controller.get_knobs()),
                              self.controller.take_actions("trainer", tr.local_step))
        if isinstance(c, Pull):
            self._execute(self.elastic.trainer(False))  # the trainer waits for a batch
            return self._pull(c.n)
        if isinstance(c, Drop):
            uids = [g.prompt.uid for g in c.groups]
            self.ledger += [(u, "dropped") for u in uids]
            self.rollout.release(uids, c.reason)
            return []
        if isinstance(c, Train):
            for g in c.groups:
                st = staleness_of(g, tr.version)
                self.staleness.append(st)
                self.check.on_trained(g, st)
            cost = sum(len(t.response_ids) for g in c.groups for t in g.trajectories) * self.s.train_token_cost
            self._execute(self.elastic.trainer(True))  # the step starts: it takes the threads granted now
            self.trainer_threads, self.training_until = self.trainer_grant, self.now + cost
            self.trainer_busy += cost
            self._at(self.now + cost, "trained", (self.run_epoch, [g.prompt.uid for g in c.groups]))
            return None
        if isinstance(c, AskOutstanding):
            queue_min = min((g.min_version for g in self.queue), default=None)
            outstanding = [v for v in (self.rollout.outstanding_min_version(), queue_min) if v is not None]
            return tr.outstanding(min(outstanding, default=None))
        if isinstance(c, Allow):
            self._execute(self.rollout.allow(c.need))
            return []
        if isinstance(c, AckKnob):
            self._ack(c)
            return []
        if isinstance(c, Sync):
            self.check.on_sync_start(tr, c)
            self._loading = False
            self._execute(self.rollout.begin_sync(c.version, tr.local_step))
            self._sync_started()
            return None
        if isinstance(c, Checkpoint):
            if c.reason == "periodic":
                assert self._cut is not None, "a periodic checkpoint without the cut of its sync"
                cut, self._cut = self._cut, None
                self._take_checkpoint(cut)
                return tr.checkpointed()
            self._execute(self.rollout.begin_hold(True))  # the rollouter's `snapshot(drain=True)`
            return self._end_hold(c.reason) if self._drained() else None
        if isinstance(c, Record):
            self.check.on_record(c, self._threshold_polled)
            self.records.append((c.step, c.version))
            return []
        if isinstance(c, Finish):
            self._finish(c.validate)
            return []
        if isinstance(c, Event):
            return []
        raise TypeError(f"not a trainer command: {c!r}")

    def _pull(self, n: int) -> list | None:
        """`Pull(n)`: what the queue has (up to n); nothing yet while knobs or actions wait (the real pull's
        timeout); else it waits for groups."""
        if self.queue or self.queue_closed or self._control_dirty:
            got, self.queue = self.queue[:n], self.queue[n:]
            self.rollout.queue_seen(len(self.queue))
            return self.trainer.pulled(got, self.queue_closed and not self.queue)
        return None

    def _drained(self) -> bool:
        ro = self.rollout
        return not (ro.aborted and ro.train_running())

    def _end_hold(self, reason: str) -> list:
        self._take_checkpoint(self._rollout_cut(), last=reason in ("final", "stop"))
        self._execute(self.rollout.end_hold())
        return self.trainer.checkpointed()

    def _sync_started(self) -> None:
        """Hook: a sync began (the costed world marks its timeline)."""

    def _trainer_progress(self) -> bool:
        """Report the outcome of the command the trainer waits on, if it came; True if anything changed."""
        w = self.waiting
        if w is None or self.done:
            return False
        if isinstance(w, Sync):
            if self.rollout.sync_ready() and not self._loading:
                self._loading = True
                self._at(self.now + self.s.sync_cost, "synced", (self.run_epoch,))
            return False
        if isinstance(w, Pull):
            more = self._pull(w.n)
        elif isinstance(w, Checkpoint):
            more = self._end_hold(w.reason) if self._drained() else None
        else:
            return False
        if more is None:
            return False
        self.waiting = None
        self._trainer_run(more)
        return True

    def _on_trained(self, run_epoch: int, uids: list[str]) -> None:
        if run_epoch != self.run_epoch:
            return
        self.ledger += [(u, "trained") for u in uids]
        self.waiting, self.training_until = None, None
        self._trainer_run(self.trainer.trained())

    def _on_synced(self, run_epoch: int) -> None:
        if run_epoch != self.run_epoch:
            return
        sync = self.waiting
        assert isinstance(sync, Sync)
        self.waiting, self._loading = None, False
        for r in self.replicas:
            if r.alive:
                r.version = sync.version
        self.trainer_busy += self.s.sync_cost
        self._execute(self.rollout.finish_sync(sync.version, self.trainer.local_step, sync.held))
        if sync.cut:
            self._cut = self._rollout_cut()
        cmds = self.trainer.synced()
        self.check.on_sync(self.trainer, self.rollout, self.replicas)
        self._trainer_run(cmds)

    def _finish(self, validate: bool) -> None:
        if validate and self.rollout.request_final_validation(self.trainer.version):
            if self.rollout.validated_version == self.trainer.version:
                self._end_run()
            else:
                self.trainer_state = "final_val"
            return
        self._end_run()

    def _end_run(self) -> None:
        self._execute(self.rollout.stop())
        self.check.on_end_tools()
        left = list(self.rollout.in_flight) + [g.prompt.uid for g in self.queue + self.trainer.buffer]
        self.ledger += [(u, "in_flight_at_end") for u in left]
        self.ledger += [(u, f"dropped:{why}") for u, why in self.rollout.dropped]
        self.trainer_state = "done"
        self.done = True
