"""The Rollouter actor: a thin shell around `engine.loop.rollout.RolloutLoop`, which makes every decision.

The shell delivers events to the loop — the training prompts of an epoch when it asks (`NeedPrompts`: read
and rendered by the dispatch thread outside the lock), replica results (the peers' `wait` on the dispatched calls,
several per replica up to its `limits()`: `engine.runtime.replica_calls`), replica deaths
and replacements, the queue's size, knob changes (routed by `engine.loop.knobs`), the trainer's sync and checkpoint requests — and carries
out the commands it returns: `generate` on a replica, abort/resume, score a finished group and put it into
the MessageQueue, close the queue, set its bound, record validation metrics and events.

Concurrency: one dispatch thread (`run`) collects results and ticks the loop; the trainer calls
`update_weights` / `snapshot` from other actor threads. Every call into the loop holds
`self.lock`, so the loop sees one event at a time.

Elastic cores (`resources.elastic_cores`, `engine.loop.elastic`): the shell feeds the `ElasticCores` core the
rollout's fact after every tick (a dispatch is out, or none) and the trainer's (`trainer_phase`: a step starts,
or the trainer waits for a batch), and carries out its `SetThreads`: a replica's threads are sent to the
replicas (applied at their next decode step), the trainer's are handed back to the trainer in `trainer_phase`'s
answer (applied at its next local step). The core has its own lock, so the trainer's report never waits behind
the dispatch thread, which holds `self.lock` while it scores and queues groups.

Its checkpoint cut and resume (`rollouter_checkpoint.py`) and its knobs, replica failures, worker states and
reports (`rollouter_report.py`) are parts of the shell kept in their own modules.

Peers (`engine.runtime.peers.RolloutPeers`): the queue, the controller and the replicas are reached only through
them — Ray actors in a run (`engine.runtime.actors.Rollouter` builds them), plain objects in one process
(`engine.runtime.peers_local`, `tests/runtime`).

Reliability: a replica whose process dies (its `generate` raises `PeerDied`) is reported to the loop
(its work goes back to pending) and replaced through the `ReplicaPool` (`rollout.max_replica_restarts`; when
spent, `fit()` returns a `failure` and the driver stops the run with a checkpoint).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from engine.loop.commands import (
    Abort, AckKnob, CallTools, CloseQueue, Dispatch, Event, NeedPrompts, Put, ReleaseTools, Resume, SetQueueBound,
    SetThreads, ValidationDone,
)
from engine.loop.elastic import TRAINER, ElasticCores
from engine.loop.rollout import RolloutLoop
from engine.loop.stream import PromptStream
from engine.runtime.rollouter_checkpoint import RolloutCheckpoints
from engine.runtime.rollouter_report import RolloutReports
from engine.runtime.peers import PeerDied, RolloutPeers, describe_failure
from engine.runtime.replica_calls import ReplicaCalls, replica_capacities
from engine.runtime.replica_pool import ReplicaPool
from engine.plan.roles import RolloutSpec
from engine.types import GenResult, Prompt, TrajectoryGroup

LOOP_WAIT_S = 0.05
"""Longest wait of one dispatch-loop turn: a finishing call wakes it at once (`ReplicaCalls.ready`); otherwise
it looks at the queue, the knobs and the clock 20 times a second. At 50–100 turns a second (each one an
actor call to the queue) the loop and the queue took a fifth of a core on the 2-core demo."""
SYNC_WAIT_TIMEOUT_S = 1800.0  # a sync waiting longer on a replica that neither answers nor dies fails the run


class RolloutShell(RolloutCheckpoints, RolloutReports):
    """Runs inside the `Rollouter` actor, from its `RolloutSpec` (`engine.plan.roles`): the loop's parameters, the
    prompt stream's length, the replica spec it starts replacement replicas from, the sampling, prompts, reward,
    tools and fault injection (`engine.plan.role_parts`), and on resume the checkpoint's rollout part
    (`{"rollout", "queued", "in_flight"}`)."""

    def __init__(self, spec: RolloutSpec, peers: RolloutPeers) -> None:
        from engine.data.prompts import load_prompts
        from engine.models.loader import load_tokenizer
        from engine.runtime.scoring import Scorer

        self.prompts = spec.prompts
        self.queue, self.controller = peers.queue, peers.controller
        replicas = peers.replicas
        self.pool = ReplicaPool(replicas, peers.spawn, spec.max_replica_restarts, peers.wait)
        self.tokenizer = load_tokenizer(spec.model_dir)
        self.scorer = Scorer(spec.scoring, self.tokenizer)
        self.sampling, self.val_sampling = spec.sampling, spec.val_sampling
        self._counters: dict[str, int] = {}
        self.tools = None
        if spec.tools is not None:
            from engine.runtime.tool_shell import ToolShell

            self.tools = ToolShell(spec.tools, self.tokenizer, self.prompts.data.apply_chat_template_kwargs)
        schemas = self.tools.registry.openai_schemas() if self.tools is not None else None
        self._filtered_reported = False
        self._need_epoch: int | None = None  # NeedPrompts: loaded by the dispatch thread outside the lock
        val_prompts: list[Prompt] = []
        if self.prompts.validate:
            val_prompts, _ = load_prompts(self.prompts.data, self.tokenizer, split="val", epoch=0, tools=schemas)
            if self.prompts.val_max_samples:
                val_prompts = val_prompts[: self.prompts.val_max_samples]
        stream = PromptStream(self.prompts.total_epochs, spec.total_rollout_steps)
        self.loop = RolloutLoop(spec.params, stream, val_prompts, len(replicas), replica_capacities(replicas))
        if self.tools is not None and self.tools.runner.warning:
            self._event("warning", "tools", self.tools.runner.warning)
        self.inbox = self.loop.inbox()
        self.lock = threading.Condition()
        self.calls = ReplicaCalls(peers.wait, keyed=spec.params.deterministic)  # the generate calls out
        self.elastic = ElasticCores(spec.elastic)
        self._elastic_lock = threading.Lock()  # the elastic core's own: the trainer never waits on `self.lock`
        self._trainer_threads = self.elastic.granted[TRAINER]  # the last SetThreads("trainer"), for trainer_phase
        self._running = False
        self.failure: str | None = None
        self._kill_at = spec.faults.kill_replica_at_step
        self._killed = False
        self._reward_errors_seen = 0
        self.tokens_since_report = 0
        self.last_report = self.version_started = time.monotonic()
        self._last_knob_poll = self._last_worker_push = 0.0
        if spec.resume:
            self._restore(spec.resume)
            self._killed = bool(self._kill_at) and self.loop.step >= self._kill_at
        self.queue.set_max_size(self.loop.queue_bound)
        if self.prompts.val_before_train and val_prompts:
            self.loop.queue_validation(self.loop.version)

    # ------------------------------------------------------------------ the dispatch thread
    def fit(self) -> dict[str, Any]:
        """Run the dispatch loop; `failure` is set when it stopped because replicas kept dying."""
        self.run()
        return {"in_flight": list(self.loop.in_flight), "dropped": [list(d) for d in self.loop.dropped],
                "failure": self.failure}

    def run(self) -> None:
        """Until stop() (or a replica failure beyond the restart budget)."""
        self._running = True
        try:
            while True:
                self._poll_knobs()
                self._deliver_prompts()
                self._collect(timeout=LOOP_WAIT_S)
                size = self.queue.size()
                with self.lock:
                    self._poll_pool()
                    if self.loop.stopped or self.failure:
                        return
                    self.loop.queue_seen(size)
                    if self.tools is not None:
                        for uid, index, answer, validation in self.tools.ready():
                            self._execute(self.loop.tools_done(uid, index, answer, validation))
                    self._execute(self.loop.tick(time.monotonic()))
                    dispatching = bool(self.loop.dispatches)
                    self.lock.notify_all()
                self._elastic_event(lambda core: core.rollout(dispatching))
                self._push_workers()
                if not self.calls:
                    time.sleep(LOOP_WAIT_S)
        finally:  # an exception reaches the driver through fit()
            with self.lock:
                self._running = False
                self.lock.notify_all()

    def _collect(self, timeout: float) -> None:
        for call in self.calls.ready(timeout):
            try:
                results: list[GenResult] | None = call.result()
                cause = None
            except PeerDied as e:  # the replica's process died
                results, cause = None, describe_failure(e)
            with self.lock:
                rid, did = self.calls.done(call, time.monotonic())
                if results is None:
                    if did not in self.loop.dispatches.by_id:  # this process's death is handled already
                        continue
                    requeued = sum(len(r.requests) for r in self.loop.running.get(rid, []))
                    self._execute(self.loop.replica_died(rid))
                    self._replica_failed(rid, cause or "died", requeued)
                else:
                    self.tokens_since_report += sum(r.new_tokens for r in results)
                    run = self.loop.dispatches.by_id.get(did)
                    calls = self.tools.parse(results, self.loop.turn_start, run is not None and run.kind == "val") \
                        if self.tools is not None else None
                    self._execute(self.loop.generation_finished(rid, results, time.monotonic(), did, calls))
                self.lock.notify_all()

    # ------------------------------------------------------------------ carrying out commands
    def _execute(self, cmds: list) -> None:
        """Carry out the loop's commands (the caller holds the lock)."""
        for c in cmds:
            if isinstance(c, Dispatch):
                replica = self.pool.replicas[c.replica]
                sampling = self.val_sampling if c.kind == "val" else self.sampling
                self.calls.send(replica, c.replica, c.dispatch_id, list(c.requests), sampling, c.kind,
                                time.monotonic())
            elif isinstance(c, Abort):
                self._signal(list(c.replicas), "abort", c.validation)
            elif isinstance(c, Resume):
                self._signal(list(c.replicas), "resume")
            elif isinstance(c, Put):
                self._put(c)
            elif isinstance(c, CloseQueue):
                self.queue.close()
            elif isinstance(c, SetQueueBound):
                self.queue.set_max_size_later(c.size)
            elif isinstance(c, ValidationDone):
                self._record_validation(c)
            elif isinstance(c, NeedPrompts):
                self._need_epoch = c.epoch
            elif isinstance(c, AckKnob):
                self.controller.ack_knob(c.name, c.version, self.loop.step)  # not waited for
            elif isinstance(c, CallTools):
                self.tools.start(c)
            elif isinstance(c, ReleaseTools):
                self.tools.release(c)
            elif isinstance(c, Event):
                self._event(c.level, c.kind, c.message, **c.extra)

    def _elastic_event(self, event: Any) -> int:
        """Feed the elastic-cores core one event (`event(core)` returns its commands) under its own lock — not
        `self.lock`, which the dispatch thread holds while it scores and queues groups — and carry out its
        `SetThreads`: the replicas take theirs at their next decode step (not waited for); the trainer's is the
        answer to its next `trainer_phase` (its next local step). Returns the trainer's threads."""
        with self._elastic_lock:
            for c in event(self.elastic):
                self._set_threads(c)
            return self._trainer_threads

    def _set_threads(self, c: SetThreads) -> None:
        if c.role == TRAINER:
            self._trainer_threads = c.threads
            return
        self.pool.signal(self.pool.live(), "set_threads", c.threads)

    def _deliver_prompts(self) -> None:
        """`NeedPrompts`: read and render the epoch's training prompts (outside the lock), then hand them in."""
        epoch = self._need_epoch
        if epoch is None:
            return
        from engine.data.prompts import load_prompts

        tools = self.tools.registry.openai_schemas() if self.tools is not None else None
        prompts, counters = load_prompts(self.prompts.data, self.tokenizer, split="train", epoch=epoch, tools=tools)
        for k, v in counters.items():
            self._counters[f"data/{k}"] = v
        self._report_filtered(epoch, counters)
        with self.lock:
            self._need_epoch = None
            self._execute(self.loop.prompts_loaded(epoch, prompts))
            self.lock.notify_all()

    def _put(self, c: Put) -> None:
        trajs = list(c.trajectories)
        self.scorer.score_group(c.prompt, trajs)
        self._report_reward_errors()
        group = TrajectoryGroup(c.prompt, trajs, generated_at=time.time(),
                                gen_seconds=time.monotonic() - c.admitted_at, admitted_version=c.admitted_version)
        evicted = self.queue.put(group)
        self._execute(self.loop.group_put(evicted.prompt.uid if evicted is not None else None))

    def _signal(self, rids: list[int], method: str, *args: Any) -> None:
        """`abort`/`resume` the given replicas and wait until each took it (a dead one is noticed elsewhere)."""
        for call in self.pool.signal(rids, method, *args):
            try:
                call.result()
            except PeerDied:
                pass

    def _record_validation(self, done: ValidationDone) -> None:
        from engine.runtime.scoring import validation_record

        by_uid = {p.uid: p for p in self.loop.val_prompts}
        scored = [(by_uid[r.request_id.rsplit("#", 1)[0]], r) for r in done.results]
        rec, summary = validation_record(self.scorer, scored, version=done.version, step=self.loop.step,
                                         turns=list(done.turns), tool_calls=list(done.tool_calls))
        self.controller.record_metrics(rec)
        self._event("info", "validation", f"validation at version {done.version}: {summary}")

    # ------------------------------------------------------------------ called by the trainer
    def update_weights(self, version: int, bucket_refs: list, step: int, snapshot: bool = False,
                       held: int = 0) -> dict[str, Any]:
        """Pause (abort training work; a running validation finishes) → load weights on every live replica →
        resume. `held`: as `engine.loop.commands.Sync` has it; a sync interval the trainer acknowledged with
        this sync (sync mode) is read from the knob table first and taken at `finish_sync`. With `snapshot`, the
        rollout side's checkpoint state is taken while paused (under key `snapshot`).

        With back buffers (`rollout.weight_sync_back_buffer`, every target replica has one) the load is split:
        the replicas receive the weights *before* the pause, while they still generate with the old ones
        (`stage_s`), and the pause only swaps them in (`transfer_s`: the swap). The loop's protocol is the same
        (begin_sync → Abort → sync_ready → weights live → finish_sync → Resume): staging is carried out
        before `begin_sync`, so nothing generated before the swap carries the new version.
        Metrics: `pause_s` = begin_sync until generation drained, `transfer_s` = the load (or swap) in the pause,
        `stage_s` = the staged receive before it (0 without back buffers), `staged` = 1 when staged."""
        t_stage = time.monotonic()
        staged = self.pool.stage_live(bucket_refs, version)  # back buffers: received while generation runs
        stage_s = time.monotonic() - t_stage
        t0 = time.monotonic()
        with self.lock:
            self._execute(self.loop.begin_sync(version, step))
            while not self.loop.sync_ready() and not self.loop.stopped and self._running:
                if time.monotonic() - t0 > SYNC_WAIT_TIMEOUT_S:
                    raise RuntimeError(f"the sync to v{version} waited {SYNC_WAIT_TIMEOUT_S:.0f} s for rollout "
                                       f"replica(s) {sorted(self.loop.running)}: a replica is hung")
                self.lock.wait(0.05)
        pause_s = time.monotonic() - t0
        t1 = time.monotonic()
        outcome = self.pool.update_live(bucket_refs, version) if staged is None else self.pool.commit(version, *staged)
        transfer_s = time.monotonic() - t1
        size = self.queue.size()
        self._poll_knobs(now=True)
        with self.lock:
            self._sync_outcome(outcome)
            now = time.monotonic()
            version_time = max(1e-9, now - self.version_started)
            active_s = self.calls.take_active(now)
            metrics: dict[str, Any] = {
                "fully_async/rollouter/active_time": active_s,
                "fully_async/rollouter/version_time": version_time,
                "fully_async/rollouter/idle_ratio": max(0.0, 1.0 - active_s / (version_time * len(self.pool))),
                "asyncrl/sync/pause_s": pause_s,
                "asyncrl/sync/transfer_s": transfer_s,
                "asyncrl/sync/stage_s": stage_s,
                "asyncrl/sync/staged": float(staged is not None),
            }
            self.version_started = now
            self.loop.queue_seen(size)
            self._execute(self.loop.finish_sync(version, step, held))
            if snapshot:
                metrics["snapshot"] = self._snapshot_locked()
            self.lock.notify_all()
        metrics["receipts"] = outcome.receipts  # the trainer's delivery check (engine.sync.verify)
        return metrics

    def load_weights(self, version: int, bucket_refs: list) -> dict[int, Any]:
        """Before the loop starts on resume: give every replica the restored weights; returns the receipts."""
        outcome = self.pool.update_live(bucket_refs, version)
        with self.lock:
            self._sync_outcome(outcome)
        return outcome.receipts

    def _sync_outcome(self, outcome: Any) -> None:
        """Replicas that died during a weight load, and replacements that joined with it (lock held)."""
        for rid, cause in outcome.dead:
            outcome.receipts.pop(rid, None)
            if rid in self.pool.down and rid not in self.pool.waiting:
                continue  # its death was noticed already (a failed generate call): a replacement is starting
            self._execute(self.loop.replica_died(rid))
            self._replica_failed(rid, cause)
        for rid in outcome.joined:
            self._execute(self.loop.replica_up(rid))
            self._event("info", "replica", f"replacement rollout replica {rid} is up with weights "
                        f"v{self.pool.latest[0] if self.pool.latest else 0}", replica=rid, phase="replaced")

    def catch_up_slots(self) -> list[int]:
        """Replacements waiting for the latest collective weights; when there are, the trainer broadcasts them a
        catch-up now, so the next full sync forms a new group generation."""
        with self.lock:
            slots = sorted(self.pool.waiting)
            if slots:
                self.pool.generation += 1
            return slots

    def replacements_starting(self) -> int:
        """Replacement replicas not yet serving (starting, or up and waiting for the latest weights); 0 once the
        restart budget is spent. The trainer waits for them after a sync (`TrainerSync._await_replacements`)."""
        with self.lock:
            return 0 if self.pool.exhausted else len(self.pool.down)

    def catch_up(self, version: int, bucket_refs: list, slots: list[int]) -> dict[int, Any]:
        """Load the trainer's catch-up broadcast of `version` on the waiting replacements; returns the receipts."""
        outcome = self.pool.catch_up(bucket_refs, version, slots)
        with self.lock:
            self._sync_outcome(outcome)
            self.lock.notify_all()
        return outcome.receipts

    def sync_generation(self) -> tuple[int, list[int]]:
        """Before a collective sync: find replicas whose process died unnoticed (a ping), replace them, and
        return the group generation the trainer must announce and its member slots (`ReplicaPool.sync_members`)."""
        actors = {rid: self.pool.replicas[rid] for rid in self.pool.live()}
        dead = self.pool.check_live()
        with self.lock:
            for rid, cause in dead:
                if rid in self.pool.down or self.pool.replicas[rid] is not actors[rid]:
                    continue  # noticed (and replaced) meanwhile
                self._execute(self.loop.replica_died(rid))
                self._replica_failed(rid, cause)
            self.lock.notify_all()
            return self.pool.sync_members()

    def trainer_phase(self, computing: bool, seq: int) -> int:
        """Elastic cores: the trainer starts a local step (`computing`) or waits for a batch (`seq`: its report's
        number; an overtaken one is ignored). Returns the threads the trainer computes with from its next step."""
        return self._elastic_event(lambda core: core.trainer(computing, seq))

    def replica_threads(self) -> list[dict[str, float]]:
        """Each live replica's threads as applied by its decode steps (`RolloutReplica.threads`)."""
        calls = self.pool.signal(self.pool.live(), "threads")
        out = []
        for call in calls:
            try:
                out.append(call.result(timeout=10))
            except Exception:  # noqa: BLE001 - dead, failed or late: its threads are left out of the report
                pass
        return out


    def allow(self, need: int) -> None:
        """The trainer postponed a sync (`stale_policy = "wait"`) and lacks `need` prompts for its next step."""
        with self.lock:
            self._execute(self.loop.allow(need))
            self.lock.notify_all()

    def release(self, uids: list[str], reason: str) -> None:
        """The trainer dropped these groups: they no longer use the budget."""
        with self.lock:
            self.loop.release(uids, reason)
            self.lock.notify_all()

    def outstanding_min_version(self) -> int | None:
        with self.lock:
            return self.loop.outstanding_min_version()

    def final_validation(self, version: int, step: int, timeout_s: float = 1800.0) -> None:
        """Validate `version` unless that already happened, and wait (bounded) until its record is written."""
        with self.lock:
            if not self._running:
                return
            self.loop.step = step
            if not self.loop.request_final_validation(version):
                return
            deadline = time.monotonic() + timeout_s
            while self.loop.validated_version != version and not self.loop.stopped and self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(min(left, 0.5))

    def stop(self) -> dict[str, Any]:
        """Stop streaming; abort replicas. Returns the uids still in flight and the dropped ones with their
        reasons (for the ledger)."""
        with self.lock:
            self._execute(self.loop.stop())
            if self.tools is not None:
                self.tools.close()
            self.lock.notify_all()
            return {"in_flight": list(self.loop.in_flight), "dropped": [list(d) for d in self.loop.dropped]}
