"""The Trainer: pulls `required_samples` prompt groups per local step from the MessageQueue, computes the
proximal / old log-probs and rollout correction, takes one optimizer step, and every
`trigger_parameter_sync_step` local steps bumps the parameter version and pushes the weights to the
rollouter (verl's `FullyAsyncTrainer.fit_step`). The algorithm lives in `engine.algo`; every decision of
the sequence (pull, drop, train, sync or not, the checkpoint cut, knobs, stop, the end) is
`engine.loop.trainer.TrainerLoop`'s: this module only executes its commands (`_do`) and reports each
outcome back, as the simulator does.

Checkpoints (`engine.persist.checkpoint`) are written when the core says `Checkpoint(reason)`: every
`checkpoint.every_versions` syncs (the rollout side is cut while the sync has it paused), on demand (controller
action `checkpoint`), at a graceful stop and at the end. When a step raises before the weights changed, a
last checkpoint is attempted with the step's groups put back (`TrainerLoop.failed`). `resume` (from `engine.persist.resume`) restores the backend and counters.

Elastic cores (`resources.elastic_cores`, `engine.loop.elastic`): before a `Pull` the shell tells the rollouter
the trainer waits (not waited for), before a `Train` that it computes, and the answer is the thread count the
step runs with (`torch.set_num_threads` here, at the step boundary; the metric `asyncrl/threads/trainer`).

With M = `resources.trainer.nnodes × gpus_per_node` > 1 this actor is rank 0 of a `TrainerGroup`
(`engine.runtime.trainer_group`): it alone runs the loop and talks to the other actors, and every backend call
fans out to the M ranks (the batch's rows split between them).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any

from engine.loop.commands import (
    AckKnob, Allow, AskOutstanding, Checkpoint, Drop, Event, ExitProcess, Finish, PollControl, Pull, Record, Sync,
    Train,
)
from engine.loop.faults import FaultPlan
from engine.loop.trainer import TrainerLoop
from engine.plan.roles import TrainerSpec
from engine.runtime.peers import PeerError, TrainerPeers, describe_failure
from engine.runtime.backends import build_reference_backend, build_trainer_backend, build_weight_sync
from engine.algo.batching import LogRatioObserver, is_ratio_metrics, prepare_batch
from engine.persist.ledger import Ledger
from engine.persist.trainer_checkpoints import TrainerCheckpoints
from engine.runtime.trainer_sync import TrainerSync
from engine.sync.object_store import ObjectStoreSync
from engine.sync.verify import DeliveryCheck
from engine.telemetry.events import run_event
from engine.telemetry.sinks import scalars_as_numbers
from engine.types import TrajectoryGroup

if TYPE_CHECKING:
    from engine.runtime.trainer_group import TrainerGroup


CONTROLLER_ANSWER_S = 60.0
"""The longest the trainer waits for the run's controller to record a knob acknowledgement (`AckKnob`; it answers
at once unless its process is stalled)."""
ELASTIC_ANSWER_S = 30.0
"""Elastic cores: how long a step waits for the rollouter's thread answer before it trains with the threads it has
(the rollouter answers at once unless its process is stalled; a dead one raises)."""


class TrainerCore(TrainerCheckpoints, TrainerSync):
    """The training loop of rank 0, from its `TrainerSpec` (`engine.plan.roles`: the loop's parameters, M ranks,
    the trainer device and threads, the weight sync, the backend, loss, batch preparation and checkpoint parts, the
    run's identity, a checkpoint's trainer part on resume).
    With M > 1 ranks it starts the other ranks (`TrainerGroup`, placed with the spec's Ray `rank_options`) and
    drives them through `BackendGroup`s in place of its backends; it alone talks to the queue, the rollouter and
    the controller, through its `TrainerPeers` (`engine.runtime.peers`: Ray actors in a run, plain objects in
    `tests/runtime`), and its fault plan's `ExitProcess` ends its process through them too."""

    controller_answer_s = CONTROLLER_ANSWER_S
    elastic_answer_s = ELASTIC_ANSWER_S

    def __init__(self, spec: TrainerSpec, peers: TrainerPeers) -> None:
        import torch

        from engine.algo.loss import build_loss_fn
        from engine.models.loader import load_tokenizer

        torch.manual_seed(spec.backend.seed)
        self.spec = spec
        self.peers = peers
        self.queue, self.rollouter, self.controller = peers.queue, peers.rollouter, peers.controller
        self.faults = FaultPlan(spec.faults.kill_trainer_at_step)
        self.world = spec.world
        self.group: TrainerGroup | None = None
        if self.world > 1:
            from engine.runtime.trainer_group import TrainerGroup

            self.group = TrainerGroup(spec)
            self.backend, self.ref_backend = self.group.policy, self.group.ref
        else:
            self.backend = build_trainer_backend(spec.backend, spec.model_dir, device=spec.device)
            self.ref_backend = build_reference_backend(spec.backend, spec.model_dir, device=spec.device) \
                if spec.loss.use_kl_loss else None
        tok = load_tokenizer(spec.model_dir)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.rc = spec.loss.rollout_correction
        self.loss_fn = LogRatioObserver(build_loss_fn(spec.loss, self.rc))
        self.loop = TrainerLoop(spec.params)
        self.inbox = self.loop.inbox()
        self.bucket_bytes = spec.weight_sync.bucket_bytes
        self.weight_sync = build_weight_sync(spec.weight_sync,  # rollout.weight_sync, resolved in the plan
                                             run_id=os.path.basename(os.path.normpath(spec.run_dir)),
                                             node_ip=peers.node_ip)
        if isinstance(self.weight_sync, ObjectStoreSync):  # the peers' object store holds the buckets
            self.weight_sync.put = peers.put
        self.delivery = DeliveryCheck()  # every sync's receipts against what was sent (engine.sync.verify)
        self.run_dir = spec.run_dir
        self.ledger = Ledger(self.run_dir)
        self.stale_processed = 0
        self.skipped_updates = 0
        self._stop_reason: str | None = None
        self._digest: str | None = None
        self._rec: dict[str, Any] = {}  # the next record: what the steps and syncs since the last one measured
        self._t_step = time.monotonic()
        self._wait_s = 0.0
        self._weights_dirty = False  # True from the optimizer step until the step is in the ledger
        self._sync_snapshot: dict | None = None  # rollout-side cut taken at a sync, for a periodic checkpoint
        self._phase_seq = 0  # elastic cores: the number of the trainer's last wait / compute report
        self.t0 = time.time()
        # the version's weights θ_v (the snapshot at each sync): π_prox in decoupled mode; deterministic mode keeps
        # them too, so that a resume between two syncs serves the replicas θ_v (`TrainerSync.push_version`)
        self.keeps_version = not self.rc.bypass_mode or spec.backend.deterministic
        self._version_restored = False  # `_restore` took θ_v from a checkpoint taken between two syncs
        if spec.resume:
            self._restore(spec.resume)
        self._start_step = self.local_step
        if self.keeps_version and not self._version_restored:
            self.backend.snapshot_params()

    # the loop's state, read by the shell
    version = property(lambda self: self.loop.version)
    local_step = property(lambda self: self.loop.local_step)
    trigger = property(lambda self: self.loop.trigger)
    since_sync = property(lambda self: self.loop.since_sync)
    total_local_steps = property(lambda self: self.loop.p.total_local_steps)
    dropped_stale = property(lambda self: self.loop.dropped_stale)

    def _restore(self, resume: dict[str, Any]) -> None:
        """Weights, optimizer and RNG from the checkpoint's trainer directory; version, step, the live sync
        interval and counters."""
        self._restore_weights(resume)
        st = resume["state"]
        counters = st["trainer"]
        self.loop.restore({**st, "dropped_stale": counters["dropped_stale"]})
        self.stale_processed = int(counters["stale_processed"])
        self.skipped_updates = int(counters["skipped_updates"])
        self.t0 = time.time() - float(counters["elapsed_s"])

    # ------------------------------------------------------------------ the executor
    def fit(self) -> dict[str, Any]:
        who = f"trainer@{socket.gethostname()}"
        self.controller.update_worker("trainer-0", {"kind": "trainer", "state": "running", "version": self.version,
                                                    "pid": os.getpid(), "host": who, "rank": 0,
                                                    "world_size": self.world})
        for rank, pid in enumerate(self.group.pids if self.group else [], start=1):
            self.controller.update_worker(f"trainer-{rank}", {"kind": "trainer", "state": "running", "pid": pid,
                                                              "rank": rank, "world_size": self.world})
        try:
            self._run(self.loop.start())
        except Exception as e:
            # one line for the terminal and the dashboard; the traceback stays in events.jsonl for a bug report
            self.controller.record_event(self._ev(
                "error", "error", f"trainer failed at step {self.local_step}: {type(e).__name__}: {describe_failure(e)}",
                traceback=traceback.format_exc(limit=8)))
            self._run(self.loop.failed(self._weights_dirty))
            raise
        finally:
            self._finish()
        return {"local_step": self.local_step, "version": self.version, "stopped": self._stop_reason,
                "weights_sha256": self._digest,
                "stop_state": self.stop_state if self._stop_reason is not None else None}

    def _run(self, cmds: list) -> None:
        """Carry out the core's commands in order, each outcome reported back (`engine.loop.trainer`)."""
        todo = deque(cmds)
        while todo:
            todo.extend(self._do(todo.popleft()))

    def _do(self, c: Any) -> list:
        """One command of `TrainerLoop`; returns what the core answers to its outcome."""
        if isinstance(c, PollControl):
            knobs, actions = self._poll_controller()
            if "stop" in actions:
                self.request_stop("requested through the controller")
            stop_at = self.spec.faults.stop_at_step  # [debug]: once per launch, not on a resume at or past it
            if stop_at and self._start_step < stop_at == self.local_step:
                self.request_stop(f"debug.stop_at_step={stop_at}")
            return self.loop.control(self.inbox.take(knobs), actions)
        if isinstance(c, Pull):
            self._await_replacements()
            if self.spec.elastic:  # the trainer waits for a batch: the rollout may take its threads
                self._phase_seq += 1
                self.rollouter.trainer_phase(False, self._phase_seq)  # not waited for
            t0 = time.monotonic()
            got, closed = self.queue.get_batch(c.n, 1.0)
            self._wait_s += time.monotonic() - t0
            if not got:
                self._catch_up()
            return self.loop.pulled(got, closed)
        if isinstance(c, Drop):
            self._record_drops(list(c.groups), c.reason)
            return []
        if isinstance(c, Train):
            self._take_threads()
            self._train(list(c.groups))
            return self.loop.trained()
        if isinstance(c, AskOutstanding):
            vs = [self.rollouter.outstanding_min_version(), self.queue.min_version()]
            return self.loop.outstanding(min((v for v in vs if v is not None), default=None))
        if isinstance(c, Allow):
            self.rollouter.allow(c.need)
            return []
        if isinstance(c, AckKnob):  # waited for: a follower (the rollouter, at a sync too) reads it next
            self._ack_knob(c)
            return []
        if isinstance(c, Sync):
            self._rec.update(self._sync(c))
            return self.loop.synced()
        if isinstance(c, Checkpoint):
            if c.reason == "periodic":
                snap, self._sync_snapshot = self._sync_snapshot, None
                self.periodic_checkpoint(snap)
            else:
                self._checkpoint_best_effort(c.reason)
            return self.loop.checkpointed()
        if isinstance(c, Record):
            self._publish(c)
            return []
        if isinstance(c, Finish):
            self._digest = self.report_weights_hash()
            if c.validate:  # the last version's validation score, as verl validates at the end of training
                self.rollouter.final_validation(self.version, self.local_step)
            return []
        if isinstance(c, Event):
            self.controller.record_event(self._ev(c.level, c.kind, c.message, **c.extra))
            return []
        if isinstance(c, ExitProcess):  # fault injection: the process dies here (never returns under Ray)
            self.peers.process.exit(c.code, c.reason)
            return []
        raise TypeError(f"not a trainer command: {c!r}")

    def _poll_controller(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """The knobs and the trainer's queued actions, at a step boundary, each waited for at most
        `CONTROLLER_ANSWER_S`: a stalled controller fails the step with one line instead of hanging the trainer."""
        try:
            return (self.controller.get_knobs(timeout=self.controller_answer_s),
                    self.controller.take_actions("trainer", self.local_step, timeout=self.controller_answer_s))
        except TimeoutError:
            raise RuntimeError(f"the run's controller did not answer the step boundary's knob poll within "
                               f"{self.controller_answer_s:.0f} s: it is stalled or unreachable") from None

    def _ack_knob(self, c: AckKnob) -> None:
        """The knob change is in force here: tell the run's controller, waiting at most `CONTROLLER_ANSWER_S`. A
        controller that does not answer fails the step with one line (the run then ends with a checkpoint and
        the resume command) rather than hanging the trainer at a step boundary."""
        try:
            self.controller.ack_knob(c.name, c.version, self.local_step).result(timeout=self.controller_answer_s)
        except TimeoutError:
            raise RuntimeError(f"the run's controller did not acknowledge the change of {c.name} (knob version "
                               f"{c.version}) within {self.controller_answer_s:.0f} s: it is stalled or "
                               "unreachable") from None

    def _take_threads(self) -> None:
        """At the step boundary: elastic cores give the step its thread count (their `SetThreads("trainer")`,
        answered by the rollouter); the metric records what the step runs with."""
        import torch

        if self.spec.elastic:
            self._phase_seq += 1
            try:
                n = int(self.rollouter.trainer_phase(True, self._phase_seq).result(timeout=self.elastic_answer_s))
            except TimeoutError:  # never wait on an optimisation: train with the threads it has
                n = torch.get_num_threads()
                self._rec["asyncrl/elastic/late_answers"] = self._rec.get("asyncrl/elastic/late_answers", 0) + 1
            if n != torch.get_num_threads():
                torch.set_num_threads(max(1, n))
        self._rec["asyncrl/threads/trainer"] = torch.get_num_threads()

    def _train(self, groups: list[TrajectoryGroup]) -> None:
        """One local step: proximal / reference log-probs, rollout correction, the optimizer step, the ledger."""
        prep = prepare_batch(groups, self.spec.batch, self.pad_id, self.version)
        rec = self._rec
        rec.update(prep.metrics)
        self.stale_processed += rec["asyncrl/stale_trajectories"]
        batch = prep.batch
        t_lp = time.monotonic()
        if len(batch) > 0:
            if self.rc.bypass_mode:
                batch.old_log_probs = batch.rollout_log_probs
            else:
                from engine.algo.loss import prepare_decoupled

                batch.old_log_probs = self.backend.proximal_log_probs(batch)
                batch, rc_metrics = prepare_decoupled(batch, self.rc)
                rec.update(rc_metrics)
            if self.ref_backend is not None:
                batch.ref_log_probs, _ = self.ref_backend.compute_log_probs(batch)
        lp_s = time.monotonic() - t_lp
        t_up = time.monotonic()
        if len(batch) > 0 and batch.response_mask.sum() > 0:
            self._weights_dirty = True
            rec.update(self.backend.train_step(batch, self.loss_fn))
            seen = self.loss_fn.take()
            if self.rc.bypass_mode:
                rec.update(is_ratio_metrics(seen))
            else:
                valid = batch.response_mask.bool()
                rec.update(is_ratio_metrics((batch.old_log_probs - batch.rollout_log_probs)[valid]))
        else:
            self.skipped_updates += 1
            self.controller.record_event(self._ev("warning", "warning",
                                                  "no trainable tokens in this batch; update skipped"))
        up_s = time.monotonic() - t_up
        self._run(self.faults.after_update(self.local_step + 1))  # [debug] kill_trainer_at_step: dies mid-step
        self.ledger.record(prep.uids, "trained", step=self.local_step + 1, version=self.version)
        self._weights_dirty = False
        rec.update(self._alarms(rec, batch, weights_moved=self.loop.since_sync > 0))
        rec.update({"training/epoch": max(int(g.prompt.epoch) for g in groups), "timing_s/old_log_prob": lp_s,
                    "timing_s/update_actor": up_s,
                    "asyncrl/trainer/tokens_per_s": prep.num_tokens / max(1e-9, lp_s + up_s)})

    def _publish(self, r: Record) -> None:
        """The step's record (`Record`): what the step and its sync measured, the loop's fields, the
        rollouter's counters."""
        rec, self._rec = self._rec, {}
        step_s = time.monotonic() - self._t_step
        rec.update({
            "training/global_step": r.step,
            "fully_async/count/current_param_version": r.version,
            "fully_async/count/stale_trajectory_processed": self.stale_processed,
            "fully_async/trainer/idle_ratio": self._wait_s / max(1e-9, step_s),
            "timing_s/gen": self._wait_s,
            "timing_s/step": step_s,
            "asyncrl/trainer/world_size": self.world,
            "asyncrl/sync_interval": r.sync_interval,
            "asyncrl/count/skipped_updates": self.skipped_updates,
            "asyncrl/count/filtered_groups": self.loop.filtered_groups,
            "asyncrl/staleness/bound": r.staleness_bound,
            "asyncrl/time": time.time() - self.t0,
            "asyncrl/total_steps": self.total_local_steps,
        })
        self._t_step, self._wait_s = time.monotonic(), 0.0
        rep = self.rollouter.report(self.local_step)
        rep["fully_async/count/dropped_stale_samples"] = rep.get("fully_async/count/dropped_stale_samples", 0) \
            + self.dropped_stale
        rec.update(rep)
        rec["fully_async/monitor/queue/mq_queue_size"] = self.queue.size()
        self.controller.record_metrics(scalars_as_numbers(rec))
        self.controller.update_worker("trainer-0", {"kind": "trainer", "state": "running", "version": self.version,
                                                    "tokens_per_s": rec.get("asyncrl/trainer/tokens_per_s", 0.0),
                                                    "step": self.local_step})

    def _record_drops(self, drop: list, reason: str) -> None:
        """Groups the core did not train — past the hard version cap (`stale_policy = "drop"`) or, with dynamic
        sampling, without reward variance: ledger, budget, event."""
        uids = [g.prompt.uid for g in drop]
        self.ledger.record(uids, "dropped", step=self.local_step, version=self.version, reason=reason)
        self.rollouter.release(uids, reason)
        if reason == "filtered":
            ev = self._ev("info", "drop", f"filtered {len(drop)} prompt(s) whose responses all scored alike "
                          f"(algorithm.filter_groups; {self.loop.filtered_groups} so far)", uids=uids, reason=reason)
        else:
            ev = self._ev("warning", "drop", f"dropped {len(drop)} prompt(s) older than max_staleness_versions="
                          f"{self.loop.p.max_staleness_versions}", uids=uids, reason=reason)
        self.controller.record_event(ev)

    def _alarms(self, rec: dict[str, Any], batch: Any, weights_moved: bool) -> dict[str, Any]:
        """`weights_moved`: an earlier step since the last sync changed the weights."""
        from engine.algo.batching import mismatch_check

        out, msgs = mismatch_check(batch, self.loss_fn, self.rc, self.version, weights_moved=weights_moved)
        for m in msgs:
            self.controller.record_event(self._ev("warning", "warning", m, alarm="mismatch"))
        return {**out, "asyncrl/mismatch_alarm": float(bool(msgs))}

    # ------------------------------------------------------------------ checkpoints
    def request_stop(self, reason: str, deadline: float | None = None, weight_bytes: int = 0) -> None:
        """Stop at the next step boundary; the core then cuts a stop checkpoint (graceful, resumable) — by
        `deadline` (time.time()) the full one if it fits, else a light one (`TrainerCheckpoints`)."""
        self.set_stop_deadline(deadline, weight_bytes)
        if self._stop_reason is None:
            self._stop_reason = reason
            self.loop.stop()
            self.controller.record_event(self._ev("info", "knob", f"graceful stop: {reason}"))

    def _finish(self) -> None:
        """Stop the rollouter and account for every prompt still in flight or queued."""
        try:
            left = self.rollouter.stop()
            queued = [g.prompt.uid for g in self.queue.drain()]
            queued += [g.prompt.uid for g in self.loop.current + self.loop.buffer]
            self.ledger.record(left["in_flight"] + queued, "in_flight_at_end", step=self.local_step,
                               version=self.version)
            by_reason: dict[str, list[str]] = {}
            for uid, reason in left["dropped"]:
                by_reason.setdefault(reason, []).append(uid)
            for reason, uids in by_reason.items():
                self.ledger.record(uids, "dropped", step=self.local_step, version=self.version, reason=reason)
        except PeerError as e:  # the rollouter or queue is gone: the run is failing anyway
            self.controller.record_event(self._ev(
                "error", "error", f"cannot account for the prompts still in flight: {type(e.__cause__ or e).__name__}"))

        finally:
            self.ledger.close()
            getattr(self.weight_sync, "close", lambda: None)()  # shared memory: no file left in /dev/shm
            if self.group is not None:
                self.group.close()

    def _ev(self, level: str, kind: str, message: str, **extra: Any) -> dict[str, Any]:
        return run_event(level, kind, message, self.local_step, self.version, **extra)
