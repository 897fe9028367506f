"""`RolloutLoop`: every decision of the rollouter, as a pure state machine (no Ray, torch or clock).

It owns the prompt stream, the in-flight table, the staleness budget, the queue's size and bound, which
replica runs what, the sync state, validation and the live knobs. Work is streamed: a replica with free rows
gets another dispatch at the next tick, up to its `Capacity` (`engine.loop.dispatch`: rows and concurrent
calls; one call of all its rows for a backend without concurrency). Events are method calls (`tick`,
`generation_finished`, `begin_sync`, `finish_sync`, `knob`, `replica_died`, …); each returns the
`commands` the shell must carry out. Time only enters as the `now` an event carries.

The protocol of a sync (the trainer pushes version v):
1. `begin_sync(v)`: no new training work is dispatched; the replicas running training work are aborted at
   their next token boundary (every training dispatch of theirs). Validation is never aborted (an `Abort`
   reaches a replica's validation calls only at `stop`): a validation of the current weights still pending
   or running finishes first — it may still be dispatched to an aborted replica — and a sync waits for it,
   as verl's trainer waits for validation.
2. `sync_ready()` turns true once no training dispatch is out and the validation is done; the shell
   loads the weights on every replica, then calls
3. `finish_sync(v)`: the budget restarts at the prompts in flight, queued or held by the trainer; aborted
   generations resume from their prefix (`partial_rollout = true`) or are dropped (`false`, as current verl);
   a validation of v is queued every `test_freq` versions.

Validation (`engine.loop.rollout_validation`), multi-turn trajectories and their tools
(`engine.loop.rollout_agent`), the checkpoint state (`engine.loop.rollout_checkpoint`) and the live knobs
(`engine.loop.rollout_knobs`) are parts of this class kept in their own modules.

Knobs take effect at once (a followed sync interval in sync mode at the next sync), so the budget, the queue bound
and the trainer's cadence always use the same value.
`trainer.deterministic`: a sync aborts nothing and waits for the loaded version's work (`engine.loop.deterministic`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.loop import deterministic
from engine.loop.agent import AgentConversation, AgentLimits
from engine.loop.budget import StalenessBudget
from engine.loop.rollout_agent import AgentTrajectories
from engine.loop.rollout_checkpoint import RolloutCheckpoint
from engine.loop.rollout_knobs import RolloutKnobs
from engine.loop.rollout_validation import ValidationRounds
from engine.loop.commands import (
    Abort,
    CloseQueue,
    Command,
    Dispatch,
    Event,
    NeedPrompts,
    Put,
    Resume,
    SetQueueBound,
)
from engine.loop.dispatch import Capacity, DispatchTable, Running
from engine.loop.inflight import (
    InFlight,
    next_turn_request,
    oldest_version,
    request_id,
)
from engine.types import GenRequest, GenResult, Prompt, Trajectory


@dataclass(frozen=True)
class RolloutParams:
    """What the rollout loop needs from a run's config (built once by the run plan: `engine.plan.roles`)."""

    n: int
    max_new_tokens: int
    required_samples: int
    staleness_threshold: float
    """In force at start (0 in sync mode)."""
    trigger: int
    partial_rollout: bool
    """True: aborted generations resume from their prefix after a sync; False: they are dropped."""
    seqs_per_call: int
    """Rows a replica runs at once when the loop is not told its `Capacity` (max(n, rollout.max_num_seqs))."""
    test_freq: int = 0
    sync_mode: bool = False
    deterministic: bool = False
    """`trainer.deterministic`: syncs wait for the loaded version's work instead of aborting it."""
    agent: AgentLimits | None = None
    """Multi-turn rollouts (`rollout.multi_turn.enable`): each trajectory is a conversation with tools."""
    val_n: int = 1
    """Answers per validation prompt (`rollout.val_n`)."""


def partial_rollout_in_force(partial_rollout: bool, sync_mode: bool, deterministic: bool) -> bool:
    """Aborted generations resume from their prefix only in fully async, non-deterministic runs: sync mode never
    interrupts a generation, deterministic mode waits for it (the run plan and the simulator both use this)."""
    return partial_rollout and not sync_mode and not deterministic


@dataclass
class SyncState:
    version: int
    step: int
    aborted: set[int] = field(default_factory=set)


class RolloutLoop(AgentTrajectories, ValidationRounds, RolloutCheckpoint, RolloutKnobs):
    """The rollouter's state machine (see the module docstring)."""

    def __init__(self, params: RolloutParams, stream: Any, val_prompts: list[Prompt], replicas: int,
                 capacities: list[Capacity] | None = None) -> None:
        """`capacities[rid]`: what replica `rid` takes at once (default: one call of `seqs_per_call` rows)."""
        self.p = params
        self.stream = stream  # engine.loop.stream.PromptStream (pure: next/state/restore)
        self.val_prompts = list(val_prompts)
        self.budget = StalenessBudget(params.required_samples, params.staleness_threshold, params.trigger)
        self.queue_size = 0
        self.queue_bound = max(1, self.budget.limit)
        self.version = 0
        self.step = 0
        self.live: set[int] = set(range(replicas))
        self.capacity = [Capacity(max(params.n, c.rows), max(1, c.calls)) for c in capacities] if capacities \
            else [Capacity(params.seqs_per_call)] * replicas
        self.dispatches = DispatchTable()
        self.aborted: set[int] = set()  # replicas whose training work was told to abort and not resumed yet
        self.in_flight: dict[str, InFlight] = {}
        self.paused = False
        self.stopped = False
        self.closed = False
        self.hold = False  # a checkpoint cut is being taken: nothing new is dispatched
        self.sync: SyncState | None = None
        self._stream_empty = False
        self._asked_epoch: int | None = None  # NeedPrompts out for this epoch
        self.val_pending: list[GenRequest] = []
        self.val_results: dict[str, GenResult] = {}
        self.val_version: int | None = None  # version of the validation pending or running
        self.validated_version: int | None = None  # last version whose validation completed
        self.val_convs: dict[str, AgentConversation] = {}  # multi-turn: each validation answer's conversation
        self.val_tools: set[str] = set()  # multi-turn: validation answers (request ids) waiting for their tools
        self.tool_users: set[tuple[str, int, bool]] = set()  # multi-turn: trajectories that called tools
        self._orphans: list[tuple[str, int, bool]] = []  # a replaced validation's: released at the next tick
        self.dropped: list[tuple[str, str]] = []  # (uid, reason), for the ledger
        self.total_generated = 0

    # ------------------------------------------------------------------ queries
    @property
    def running(self) -> dict[int, list[Running]]:
        """The dispatches out now, per replica (only replicas with at least one)."""
        return self.dispatches.by_replica()

    def exhausted(self) -> bool:
        """Stream done, nothing admitted left, no validation pending: the queue can close."""
        return (self.stream.emitted >= self.stream.total or self._stream_empty) and not self.in_flight \
            and not self.dispatches and not self.val_pending

    def sync_ready(self) -> bool:
        """During a sync: no training dispatch is out and the current version's validation is done."""
        return self.sync is not None and not self.dispatches.any("train") and not self.validating() \
            and (not self.p.deterministic or deterministic.version_done(self))

    def train_running(self) -> list[int]:
        """Replicas with at least one training dispatch out."""
        return self.dispatches.replicas_running("train")

    def outstanding_min_version(self) -> int | None:
        """Oldest version still feeding an unfinished prompt (`engine.loop.inflight.oldest_version`)."""
        return oldest_version(list(self.in_flight.values()))

    # ------------------------------------------------------------------ events
    def tick(self, now: float) -> list[Command]:
        """Fill the free rows of every live replica: validation first, then resumed prefixes, then new prompts."""
        cmds: list[Command] = self._release_tools(self._orphans)
        self._orphans = []
        if self.stopped:
            return cmds
        if self.p.deterministic:  # a prompt restored from a checkpoint may be finished already
            cmds += self._on_train_results([], now)
        if not self.closed and self.exhausted():
            self.closed = True
            cmds += [CloseQueue(), Event("info", "finish", "prompt stream exhausted; queue closed")]
        if self.hold:
            return cmds
        want = sorted(self.live)
        while want:  # round robin: one dispatch per replica and round, so the replicas share the work
            got = [(rid, self._next_dispatch(rid, now)) for rid in want]
            cmds += [d for _, d in got if d is not None]
            want = [rid for rid, d in got if d is not None]
        need = self.stream.needs()
        if need is not None and need != self._asked_epoch:
            self._asked_epoch = need
            cmds.append(NeedPrompts(need))
        return cmds

    def prompts_loaded(self, epoch: int, prompts: list[Prompt]) -> list[Command]:
        """`NeedPrompts`' outcome: epoch `epoch`'s training prompts in their order (admitted from the next tick)."""
        self.stream.deliver(epoch, prompts)
        self._asked_epoch = None
        return []

    def _next_dispatch(self, rid: int, now: float) -> Dispatch | None:
        """One more dispatch for replica `rid` if it has a free call and free rows and there is work for it."""
        room = self.dispatches.room(rid, self.capacity[rid], self.p.n)
        if room <= 0:
            return None
        if self.val_pending:  # an aborted replica still runs validation: its abort holds training work only
            reqs, self.val_pending = self.val_pending[:room], self.val_pending[room:]
            return self._dispatch(rid, reqs, "val", now)
        if rid in self.aborted or (self.sync is not None and not (self.p.deterministic
                                                                   and deterministic.owes_work(self))):
            return None  # deterministic mode: a sync waits for the loaded version's work, which goes on
        reqs = self._take_pending(room)
        if not self.paused and room - len(reqs) >= self.p.n:  # a whole group fits: admit
            reqs += self._admit(room - len(reqs), now)
        return self._dispatch(rid, reqs, "train", now) if reqs else None

    def generation_finished(self, rid: int, results: list[GenResult], now: float,
                            dispatch_id: int | None = None,
                            tool_calls: dict[str, list[Any]] | None = None) -> list[Command]:
        """Replica `rid` returned dispatch `dispatch_id` (None: the one whose requests these are).
        `tool_calls` (multi-turn): the calls the shell parsed from each stopped turn, by request id."""
        run = self.dispatches.by_id.get(dispatch_id) if dispatch_id is not None else \
            self.dispatches.find(rid, [r.request_id for r in results])
        if run is None or run.replica != rid:
            return []
        self.dispatches.pop(run.id)
        if run.kind == "val":
            return self._on_val_results(results, run, tool_calls)
        return self._on_train_results(results, now, tool_calls or {})

    def replica_died(self, rid: int) -> list[Command]:
        """Its dispatches are put back (train requests pending with their prefix, validation in front)."""
        self.live.discard(rid)
        self.aborted.discard(rid)
        for run in reversed(self.dispatches.pop_replica(rid)):
            self._requeue(run)
        return []

    def replica_up(self, rid: int) -> list[Command]:
        """A replacement replica in slot `rid` is up with the current weights."""
        self.live.add(rid)
        return []

    def queue_seen(self, size: int) -> None:
        """The queue's actual size (the trainer took groups)."""
        self.queue_size = size

    def group_put(self, evicted_uid: str | None) -> list[Command]:
        """A `Put` was carried out; `evicted_uid`: the group the full queue evicted, if any."""
        self.queue_size += 1
        self.total_generated += 1
        if evicted_uid is None:
            return []
        self.queue_size -= 1
        return self._drop(evicted_uid, "queue_overflow") + [
            Event("warning", "drop", f"queue full: evicted prompt {evicted_uid}",
                  {"uid": evicted_uid, "uids": [evicted_uid], "reason": "queue_overflow"})]

    def begin_sync(self, version: int, step: int) -> list[Command]:
        """The trainer pushes `version`: stop dispatching training work and abort what runs."""
        self.sync = SyncState(version, step, set() if self.p.deterministic else set(self.train_running()))
        if not self.sync.aborted:
            return []
        self.aborted |= self.sync.aborted
        return [Abort(tuple(sorted(self.sync.aborted)))]

    def finish_sync(self, version: int, step: int, held: int = 0) -> list[Command]:
        """The weights of `version` are live: restart the budget (`held`: `Sync.held`), resume, queue validation."""
        assert self.sync is not None, "finish_sync without begin_sync"
        cmds: list[Command] = []
        self.version, self.step = version, step
        self.take_held_trigger()  # sync mode: the interval the trainer acknowledged with this sync
        self.budget.on_sync(len(self.in_flight), self.queue_size + held)
        cmds += self._bound_changed()
        resume = sorted(self.aborted & self.live)
        self.aborted.clear()
        if resume:
            cmds.append(Resume(tuple(resume)))
        if self.p.test_freq and self.val_prompts and version % self.p.test_freq == 0:
            self.queue_validation(version)
        self.sync = None
        return cmds

    def allow(self, k: int) -> list[Command]:
        """The trainer postponed a sync and still lacks `k` prompts for its next step."""
        self.budget.allow(max(0, k - len(self.in_flight) - self.queue_size))
        return self._bound_changed()

    def release(self, uids: list[str], reason: str) -> None:
        """The trainer dropped these groups (e.g. stale): they no longer use the budget."""
        self.budget.release(len(uids))

    def begin_hold(self, drain: bool) -> list[Command]:
        """A checkpoint cut: dispatch nothing; with `drain` (partial rollout) abort training work so its
        partial responses are in the cut."""
        self.hold = True
        if not (drain and self.p.partial_rollout):
            return []
        rids = [r for r in self.train_running() if r not in self.aborted]
        self.aborted |= set(rids)
        return [Abort(tuple(rids))] if rids else []

    def end_hold(self) -> list[Command]:
        self.hold = False
        if self.sync is not None:  # a sync's aborts stay until it finishes
            return []
        resume = sorted(self.aborted & self.live)
        self.aborted.clear()
        return [Resume(tuple(resume))] if resume else []

    def stop(self) -> list[Command]:
        """Stop streaming: abort every replica, validation included."""
        self.stopped = True
        rids = tuple(sorted(self.live))
        return ([Abort(rids, validation=True)] if rids else []) + self._release_tools(sorted(self.tool_users))

    # ------------------------------------------------------------------ internals
    def _dispatch(self, rid: int, reqs: list[GenRequest], kind: str, now: float) -> Dispatch:
        run = self.dispatches.add(rid, kind, reqs, now)
        return Dispatch(rid, tuple(reqs), kind, run.id)

    def _take_pending(self, capacity: int) -> list[GenRequest]:
        out: list[GenRequest] = []
        for st in self.in_flight.values():
            if not st.pending:
                continue
            for idx in sorted(st.pending):
                if len(out) >= capacity:
                    return out
                out.append(st.pending.pop(idx))
                st.running.add(idx)
        return out

    def _admit(self, capacity: int, now: float) -> list[GenRequest]:
        out: list[GenRequest] = []
        while capacity - len(out) >= self.p.n and self.budget.can_admit() and self.queue_size < self.queue_bound:
            p = self.stream.next()
            if p is None:
                self._stream_empty = self.stream.needs() is None  # else: NeedPrompts, then more
                break
            self.budget.admit()
            st = InFlight(p, now, self.version)
            if self.p.agent is not None:
                st.convs = {i: AgentConversation(self.p.agent) for i in range(self.p.n)}
            for i in range(self.p.n):
                st.running.add(i)
                out.append(next_turn_request(p, i, st.convs[i]) if st.convs else
                           GenRequest(request_id(p.uid, i), p.prompt_ids, max_new_tokens=self.p.max_new_tokens,
                                      images=p.images))
            self.in_flight[p.uid] = st
        return out

    def _on_train_results(self, results: list[GenResult], now: float,
                          tool_calls: dict[str, list[Any]] | None = None) -> list[Command]:
        cmds: list[Command] = []
        finished: list[InFlight] = []
        dropped: list[str] = []
        for r in results:
            uid, idx = r.request_id.rsplit("#", 1)
            st = self.in_flight.get(uid)
            if st is None:  # dropped or stopped meanwhile
                continue
            i = int(idx)
            st.running.discard(i)
            if self.p.agent is not None and not (r.finish_reason == "abort" and (self.stopped or (
                    not self.p.partial_rollout and self.sync is not None))):
                cmds += self._agent_turn(st, i, r, (tool_calls or {}).get(r.request_id))
                if len(st.done) == self.p.n and st not in finished:
                    finished.append(st)
                continue
            if r.finish_reason == "abort":
                if self.stopped:
                    continue
                if not self.p.partial_rollout and self.sync is not None:
                    cmds += self._drop(uid, "aborted_at_sync")
                    dropped.append(uid)
                    continue
                st.pending[i] = GenRequest(r.request_id, st.prompt.prompt_ids, images=st.prompt.images,
                                           prefix_ids=list(r.response_ids), prefix_log_probs=list(r.log_probs),
                                           max_new_tokens=self.p.max_new_tokens - len(r.response_ids),
                                           min_version=r.min_version)
                continue
            st.done[i] = Trajectory(list(r.response_ids), list(r.log_probs), r.finish_reason,
                                    r.min_version, r.max_version)
            if len(st.done) == self.p.n:
                finished.append(st)
        if self.p.deterministic:  # into the queue in admission (stream) order, whatever finished first
            finished = deterministic.ready_in_order(self.in_flight, self.p.n)
        if dropped:
            cmds.append(Event("info", "drop", f"{len(dropped)} prompt(s) aborted at the sync to v{self.sync.version} "
                              "and dropped (partial_rollout = false)", {"uids": dropped, "reason": "aborted_at_sync"}))
        for st in finished:
            del self.in_flight[st.prompt.uid]
            cmds.append(Put(st.prompt, tuple(st.done[i] for i in range(self.p.n)), st.admitted_version,
                            st.admitted_at))
        return cmds

    def _requeue(self, run: Running) -> None:
        if run.kind == "val":
            self.val_pending = list(run.requests) + self.val_pending
            return
        for req in run.requests:
            uid, idx = req.request_id.rsplit("#", 1)
            st = self.in_flight.get(uid)
            if st is not None:
                st.running.discard(int(idx))
                st.pending[int(idx)] = req

    def _drop(self, uid: str, reason: str) -> list[Command]:
        self.in_flight.pop(uid, None)
        self.dropped.append((uid, reason))
        self.budget.release(1)
        return self._release_tools(sorted(k for k in self.tool_users if k[0] == uid and not k[2]))

    def _bound_changed(self) -> list[Command]:
        bound = max(1, self.budget.limit + self.budget.extra, self.budget.staleness_samples, self.queue_size)
        if bound == self.queue_bound:
            return []
        self.queue_bound = bound
        return [SetQueueBound(bound)]
