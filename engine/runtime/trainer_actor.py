"""The Trainer: pulls `required_samples` prompt groups per local step from the MessageQueue, computes the
proximal / old log-probs and rollout correction, takes one optimizer step, and every
`trigger_parameter_sync_step` local steps bumps the parameter version and pushes the weights to the
rollouter (verl's `FullyAsyncTrainer.fit_step`). The algorithm lives in `engine.algo`; this module only
sequences it and reports.

Checkpoints (`engine.runtime.checkpoint`) are taken between steps: every `checkpoint.every_versions` syncs
(the rollout side is cut while the sync has it paused), on demand (controller action `checkpoint`), at a
graceful stop and at the end. When a step raises before the weights changed, a last checkpoint is attempted
with the step's groups put back. `resume` (from `engine.runtime.resume`) restores the backend and counters.

With M = `resources.trainer.nnodes × gpus_per_node` > 1 this actor is rank 0 of a `TrainerGroup`
(`engine.runtime.trainer_group`): it alone runs the loop and talks to the other actors, and every backend call
fans out to the M ranks (the batch's rows split between them).
"""

from __future__ import annotations

import math
import os
import socket
import time
import traceback
from typing import Any

import ray

from engine.loop.trainer import TrainerLoop, TrainerParams
from engine.runtime.backends import RunConfig, build_trainer_backend
from engine.runtime.batching import LogRatioObserver, is_ratio_metrics, prepare_batch
from engine.runtime.ledger import Ledger
from engine.runtime.trainer_checkpoints import TrainerCheckpoints
from engine.runtime.trainer_group import TrainerGroup, trainer_world
from engine.sync.runtime import build_weight_sync, publish
from engine.types import TrajectoryGroup


class TrainerCore(TrainerCheckpoints):
    """The training loop of rank 0. With M = `trainer_world(cfg)` > 1 ranks it starts the other ranks
    (`TrainerGroup`, placed with Ray `rank_options`, `num_threads` each) and drives them through `BackendGroup`s
    in place of its backends; it alone talks to the queue, the rollouter and the controller."""

    def __init__(self, cfg: RunConfig, model_dir: str, run_dir: str, queue: Any, rollouter: Any, controller: Any,
                 resume: dict | None = None, rank_options: dict[str, Any] | None = None,
                 num_threads: int = 1, device: Any = None) -> None:
        import torch

        from engine.plan.sizes import required_samples, total_train_steps
        from engine.algo.loss import build_loss_fn
        from engine.models.loader import load_tokenizer

        torch.manual_seed(cfg.trainer.seed)
        self.cfg = cfg
        self.queue, self.rollouter, self.controller = queue, rollouter, controller
        self.world = trainer_world(cfg)
        self.group: TrainerGroup | None = None
        if self.world > 1:
            self.group = TrainerGroup(cfg, model_dir, self.world, rank_options, num_threads, device)
            self.backend, self.ref_backend = self.group.policy, self.group.ref
        else:
            self.backend = build_trainer_backend(cfg, model_dir, device=device)
            self.ref_backend = build_trainer_backend(cfg, model_dir, device=device) if cfg.trainer.use_kl_loss else None
        tok = load_tokenizer(model_dir)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.rc = cfg.algorithm.rollout_correction
        self.loss_fn = LogRatioObserver(build_loss_fn(cfg.trainer, self.rc))
        self.required = required_samples(cfg)
        trigger = cfg.async_training.trigger_parameter_sync_step
        self.loop = TrainerLoop(TrainerParams.from_config(cfg, total_train_steps(cfg) * trigger))
        self.sync_mode = cfg.async_training.mode == "sync"
        self.cap = cfg.async_training.max_staleness_versions
        self.stale_policy = cfg.async_training.stale_policy
        self.bucket_bytes = cfg.rollout.weight_sync_bucket_mb * 2**20
        self.weight_sync = build_weight_sync(cfg, device.type if device else None)  # object store or collective broadcast (engine.sync.runtime)
        self.run_dir = run_dir
        self.ledger = Ledger(run_dir)
        self.stale_processed = 0
        self.skipped_updates = 0
        self._stop = False
        self._stop_reason: str | None = None
        self._postponed_reported = False
        self._owed_rec: dict[str, Any] = {}  # a sync made at a boundary (a lowered interval), for the next record
        self._current: list[TrajectoryGroup] = []  # groups of the step in progress
        self._weights_dirty = False  # True from the optimizer step until the step is in the ledger
        self._sync_snapshot: dict | None = None  # rollout-side cut taken at a sync, for a periodic checkpoint
        self._last_ckpt_step: int | None = None
        self.t0 = time.time()
        if resume:
            self._restore(resume)
        if not self.rc.bypass_mode:
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
        self.backend.load(resume["trainer_dir"])
        st = resume["state"]
        counters = st["trainer"]
        self.loop.restore({**st, "dropped_stale": counters["dropped_stale"]})
        self.stale_processed = int(counters["stale_processed"])
        self.skipped_updates = int(counters["skipped_updates"])
        self.t0 = time.time() - float(counters["elapsed_s"])
        self._last_ckpt_step = self.local_step

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        who = f"trainer@{socket.gethostname()}"
        self.controller.update_worker.remote("trainer-0", {"kind": "trainer", "state": "running",
                                                           "version": self.version, "pid": os.getpid(), "host": who,
                                                           "rank": 0, "world_size": self.world})
        for rank, pid in enumerate(self.group.pids if self.group else [], start=1):
            self.controller.update_worker.remote(f"trainer-{rank}", {"kind": "trainer", "state": "running",
                                                                     "pid": pid, "rank": rank,
                                                                     "world_size": self.world})
        try:
            while self.local_step < self.total_local_steps and not self._stop:
                self._apply_knobs()
                if self._stop:
                    break
                if not self._step():
                    break
            self._checkpoint_best_effort("stop" if self._stop else "final")
            digest = self.report_weights_hash()
            if not self._stop and self.cfg.trainer.test_freq:
                # the last version's validation score, as verl validates at the end of training
                ray.get(self.rollouter.final_validation.remote(self.version, self.local_step))
        except Exception:
            self.controller.record_event.remote(self._ev("error", "error", traceback.format_exc(limit=8)))
            self._checkpoint_after_failure()
            raise
        finally:
            self._finish()
        return {"local_step": self.local_step, "version": self.version, "stopped": self._stop_reason,
                "weights_sha256": digest}

    def _step(self) -> bool:
        t_start = time.monotonic()
        if not self._pull():
            return False
        wait_s = time.monotonic() - t_start
        groups, stale = self.loop.take_batch()
        self._record_stale_drops(stale)
        if not groups:
            return True
        self._current = groups
        prep = prepare_batch(groups, self.cfg, self.pad_id, self.version)
        rec: dict[str, Any] = dict(prep.metrics)
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
            self.controller.record_event.remote(self._ev("warning", "warning",
                                                         "no trainable tokens in this batch; update skipped"))
        up_s = time.monotonic() - t_up
        self.loop.step_done()
        if self.cfg.debug.kill_trainer_at_step == self.local_step:
            os._exit(17)  # fault injection ([debug] kill_trainer_at_step): the process dies mid-run
        self.ledger.record(prep.uids, "trained", step=self.local_step, version=self.version)
        self._current, self._weights_dirty = [], False
        rec.update(self._alarms(rec, batch))
        rec.update(self._owed_rec)
        self._owed_rec = {}
        rec.update(self._maybe_sync())
        step_s = time.monotonic() - t_start
        compute_s = max(1e-9, lp_s + up_s)
        rec.update({
            "training/global_step": self.local_step,
            "training/epoch": max(int(g.prompt.epoch) for g in groups),
            "fully_async/count/current_param_version": self.version,
            "fully_async/count/stale_trajectory_processed": self.stale_processed,
            "fully_async/trainer/idle_ratio": wait_s / max(1e-9, step_s),
            "timing_s/gen": wait_s,
            "timing_s/old_log_prob": lp_s,
            "timing_s/update_actor": up_s,
            "timing_s/step": step_s,
            "asyncrl/trainer/tokens_per_s": prep.num_tokens / compute_s,
            "asyncrl/trainer/world_size": self.world,
            "asyncrl/sync_interval": self.trigger,
            "asyncrl/count/skipped_updates": self.skipped_updates,
            "asyncrl/staleness/bound": self._staleness_bound(),
            "asyncrl/time": time.time() - self.t0,
            "asyncrl/total_steps": self.total_local_steps,
        })
        rep = ray.get(self.rollouter.report.remote(self.local_step))
        rep["fully_async/count/dropped_stale_samples"] = rep.get("fully_async/count/dropped_stale_samples", 0) \
            + self.dropped_stale
        rec.update(rep)
        rec["fully_async/monitor/queue/mq_queue_size"] = ray.get(self.queue.size.remote())
        self.controller.record_metrics.remote(_jsonable(rec))
        self.controller.update_worker.remote("trainer-0", {"kind": "trainer", "state": "running",
                                                           "version": self.version,
                                                           "tokens_per_s": rec["asyncrl/trainer/tokens_per_s"],
                                                           "step": self.local_step})
        if self._sync_snapshot is not None:
            snap, self._sync_snapshot = self._sync_snapshot, None
            self.save_checkpoint("periodic", snap)
        return True

    # ------------------------------------------------------------------ data
    def _pull(self) -> bool:
        """Pull until the loop can take a step (in sync mode a whole cycle is generated before training)."""
        while not self.loop.can_step() and not self.loop.closed and not self._stop:
            got, closed = ray.get(self.queue.get_batch.remote(self.loop.want(), 1.0))
            self.loop.offer(got, closed)
            if not got:
                self._apply_knobs()
        if self._stop and len(self.loop.buffer) < self.required:
            return False  # stopping: no partial step; the buffer goes into the stop checkpoint
        return self.loop.can_step()

    def _record_stale_drops(self, drop: list) -> None:
        """Groups the hard version cap dropped (`stale_policy = "drop"`): ledger, budget, event."""
        if not drop:
            return
        uids = [g.prompt.uid for g in drop]
        self.ledger.record(uids, "dropped", step=self.local_step, version=self.version, reason="stale")
        self.rollouter.release.remote(uids, "stale")
        self.controller.record_event.remote(self._ev(
            "warning", "drop", f"dropped {len(drop)} prompt(s) older than max_staleness_versions={self.cap}",
            uids=uids, reason="stale"))

    def _staleness_bound(self) -> float:
        """The hard cap when set, else verl's nominal bound ceil(staleness_threshold) (0 in sync mode)."""
        if self.cap is not None:
            return float(self.cap)
        return 0.0 if self.sync_mode else float(math.ceil(self.cfg.async_training.staleness_threshold))

    # ------------------------------------------------------------------ sync
    def _maybe_sync(self) -> dict[str, Any]:
        """At a local-step boundary: sync when the loop says so; under `stale_policy = "wait"` a postponed
        sync lets the rollouter admit just what the next step lacks."""
        p, outstanding = self.loop.p, None
        if p.max_staleness_versions is not None and p.stale_policy == "wait" and self.loop.since_sync >= self.trigger:
            vs = [ray.get(self.rollouter.outstanding_min_version.remote()), ray.get(self.queue.min_version.remote())]
            outstanding = min((v for v in vs if v is not None), default=None)
        decision = self.loop.sync_decision(outstanding)
        if decision.action == "sync":
            self._postponed_reported = False
            return self._sync()
        if decision.action == "postpone":
            if not self._postponed_reported:
                self._postponed_reported = True
                self.controller.record_event.remote(self._ev(
                    "info", "sync", "sync postponed: outstanding work would exceed max_staleness_versions; "
                    "admitting only what the next step lacks"))
            ray.get(self.rollouter.allow.remote(decision.need))
        return {}

    def _sync(self) -> dict[str, float]:
        """version += 1; push the weights (bucketed, by `rollout.weight_sync`'s transport) to every replica."""
        t0 = time.monotonic()
        version = self.version + 1
        every = self.cfg.checkpoint.every_versions
        cut = bool(every) and version % every == 0  # a periodic checkpoint follows this step
        knob = self._pending_trigger() if self.sync_mode else None  # sync mode: a new interval starts here
        trigger = int(knob["value"]) if knob else None
        pending, nbytes = publish(self.weight_sync, version, self.backend.export_weights(self.bucket_bytes),
                                  lambda refs: self.rollouter.update_weights.remote(version, refs, self.local_step,
                                                                                    cut, trigger))
        export_s = time.monotonic() - t0
        out = ray.get(pending)
        self.loop.synced()
        if knob:
            self.loop.set_trigger(trigger)
            self.controller.ack_knob.remote("trigger_parameter_sync_step", knob["version"], self.local_step)
        self._sync_snapshot = out.pop("snapshot", None)
        if not self.rc.bypass_mode:
            t_snap = time.monotonic()
            self.backend.snapshot_params()
            out["asyncrl/prox_snapshot_s"] = time.monotonic() - t_snap
        total = time.monotonic() - t0
        out.update({"timing_s/param_sync": total, "asyncrl/sync/bytes": nbytes, "asyncrl/sync/export_s": export_s})
        self.controller.record_event.remote(self._ev(
            "info", "sync", f"weights v{self.version} pushed: {nbytes / 2**20:.1f} MiB in {total:.2f}s "
            f"(pause {out['asyncrl/sync/pause_s']:.2f}s, transfer {out['asyncrl/sync/transfer_s']:.2f}s)",
            bytes=nbytes, seconds=total, pause_s=out["asyncrl/sync/pause_s"],
            transfer_s=out["asyncrl/sync/transfer_s"], interval=self.trigger))
        return out

    # ------------------------------------------------------------------ control plane
    def _pending_trigger(self) -> dict[str, Any] | None:
        k = ray.get(self.controller.get_knobs.remote()).get("trigger_parameter_sync_step")
        return k if k and k.get("pending") else None

    def _apply_knobs(self) -> None:
        """At a local-step boundary: the sync interval (async mode; sync mode takes it at the sync), applied
        by the rollouter's budget in the same breath; a lowered interval can make a sync due at once."""
        k = None if self.sync_mode else self._pending_trigger()
        if k:
            self.loop.set_trigger(int(k["value"]))
            ray.get(self.rollouter.set_trigger.remote(self.trigger))
            self.controller.ack_knob.remote("trigger_parameter_sync_step", k["version"], self.local_step)
            if self.loop.sync_owed() and not self.loop.finished():
                self._owed_rec.update(self._maybe_sync())
        for action in ray.get(self.controller.take_actions.remote("trainer")):
            if action == "stop":
                self.request_stop("requested through the controller")
            elif action == "checkpoint":
                self._checkpoint_best_effort("on_demand")

    def _alarms(self, rec: dict[str, Any], batch: Any) -> dict[str, Any]:
        from engine.runtime.batching import mismatch_check

        # since_sync already counts this step: the weights moved since the sync when an earlier step trained
        out, msgs = mismatch_check(batch, self.loss_fn, self.rc, self.version,
                                   weights_moved=self.loop.since_sync > 1)
        for m in msgs:
            self.controller.record_event.remote(self._ev("warning", "warning", m, alarm="mismatch"))
        return {**out, "asyncrl/mismatch_alarm": float(bool(msgs))}

    # ------------------------------------------------------------------ checkpoints
    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary; the loop then writes a stop checkpoint (graceful, resumable)."""
        if not self._stop:
            self._stop, self._stop_reason = True, reason
            self.controller.record_event.remote(self._ev("info", "knob", f"graceful stop: {reason}"))

    def _finish(self) -> None:
        """Stop the rollouter and account for every prompt still in flight or queued."""
        try:
            left = ray.get(self.rollouter.stop.remote())
            queued = [g.prompt.uid for g in ray.get(self.queue.drain.remote())]
            queued += [g.prompt.uid for g in self._current + self.loop.buffer]
            self.ledger.record(left["in_flight"] + queued, "in_flight_at_end", step=self.local_step,
                               version=self.version)
            by_reason: dict[str, list[str]] = {}
            for uid, reason in left["dropped"]:
                by_reason.setdefault(reason, []).append(uid)
            for reason, uids in by_reason.items():
                self.ledger.record(uids, "dropped", step=self.local_step, version=self.version, reason=reason)
        except ray.exceptions.RayError as e:  # the rollouter or queue is gone: the run is failing anyway
            self.controller.record_event.remote(self._ev(
                "error", "error", f"cannot account for the prompts still in flight: {type(e).__name__}"))
        finally:
            self.ledger.close()
            if self.group is not None:
                self.group.close()

    def _ev(self, level: str, kind: str, message: str, **extra: Any) -> dict[str, Any]:
        return {"time": time.time(), "kind": kind, "level": level, "step": self.local_step,
                "version": self.version, "message": message, **extra}


def _jsonable(rec: dict[str, Any]) -> dict[str, Any]:
    """Tensor/numpy scalars as plain Python numbers."""
    return {k: v.item() if hasattr(v, "item") else v for k, v in rec.items()}


@ray.remote(max_concurrency=2)
class Trainer:
    """Thin actor around `TrainerCore` (rank 0 of the trainer; `rank_options`: Ray options of the other ranks)."""

    def __init__(self, cfg: RunConfig, model_dir: str, run_dir: str, queue: Any, rollouter: Any, controller: Any,
                 num_threads: int = 1, resume: dict | None = None,
                 rank_options: dict[str, Any] | None = None, device: Any = None) -> None:
        import torch

        torch.set_num_threads(max(1, num_threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.core = TrainerCore(cfg, model_dir, run_dir, queue, rollouter, controller, resume,
                                rank_options=rank_options, num_threads=num_threads, device=device)

    def fit(self) -> dict[str, Any]:
        return self.core.fit()

    def request_stop(self, reason: str) -> None:
        self.core.request_stop(reason)

    def push_weights(self) -> None:
        """Resume: give the rollout replicas the restored weights before generation starts."""
        refs = [ray.put(b) for b in self.core.backend.export_weights(self.core.bucket_bytes)]
        ray.get(self.core.rollouter.load_weights.remote(self.core.version, refs))
