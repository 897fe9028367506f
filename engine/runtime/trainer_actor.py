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

from engine.runtime.backends import build_trainer_backend
from engine.runtime.batching import LogRatioObserver, is_ratio_metrics, prepare_batch, staleness_of
from engine.runtime.ledger import Ledger
from engine.runtime.trainer_group import TrainerGroup, trainer_world
from engine.sync.runtime import build_weight_sync, publish
from engine.types import TrajectoryGroup


class TrainerCore:
    """The training loop of rank 0. With M = `trainer_world(cfg)` > 1 ranks it starts the other ranks
    (`TrainerGroup`, placed with Ray `rank_options`, `num_threads` each) and drives them through `BackendGroup`s
    in place of its backends; it alone talks to the queue, the rollouter and the controller."""

    def __init__(self, cfg: Any, model_dir: str, run_dir: str, queue: Any, rollouter: Any, controller: Any,
                 resume: dict | None = None, rank_options: dict[str, Any] | None = None,
                 num_threads: int = 1) -> None:
        import torch

        from asyncrl_cli.config.derived import required_samples, total_train_steps
        from engine.algo.loss import build_loss_fn
        from engine.models.loader import load_tokenizer

        torch.manual_seed(cfg.trainer.seed)
        self.cfg = cfg
        self.queue, self.rollouter, self.controller = queue, rollouter, controller
        self.world = trainer_world(cfg)
        self.group: TrainerGroup | None = None
        if self.world > 1:
            self.group = TrainerGroup(cfg, model_dir, self.world, rank_options, num_threads)
            self.backend, self.ref_backend = self.group.policy, self.group.ref
        else:
            self.backend = build_trainer_backend(cfg, model_dir)
            self.ref_backend = build_trainer_backend(cfg, model_dir) if cfg.trainer.use_kl_loss else None
        tok = load_tokenizer(model_dir)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.rc = cfg.algorithm.rollout_correction
        self.loss_fn = LogRatioObserver(build_loss_fn(cfg.trainer, self.rc))
        self.required = required_samples(cfg)
        self.trigger = cfg.async_training.trigger_parameter_sync_step
        self.total_local_steps = total_train_steps(cfg) * self.trigger
        self.sync_mode = cfg.async_training.mode == "sync"
        self.cap = cfg.async_training.max_staleness_versions
        self.stale_policy = cfg.async_training.stale_policy
        self.bucket_bytes = cfg.rollout.weight_sync_bucket_mb * 2**20
        self.weight_sync = build_weight_sync(cfg)  # object store or collective broadcast (engine.sync.runtime)
        self.run_dir = run_dir
        self.ledger = Ledger(run_dir)
        self.version = 0
        self.local_step = 0
        self.since_sync = 0
        self.stale_processed = 0
        self.dropped_stale = 0
        self.skipped_updates = 0
        self._buffer: list = []
        self._closed = False
        self._stop = False
        self._stop_reason: str | None = None
        self._postponed = False
        self._current: list[TrajectoryGroup] = []  # groups of the step in progress
        self._weights_dirty = False  # True from the optimizer step until the step is in the ledger
        self._sync_snapshot: dict | None = None  # rollout-side cut taken at a sync, for a periodic checkpoint
        self._last_ckpt_step: int | None = None
        self.t0 = time.time()
        if resume:
            self._restore(resume)
        if not self.rc.bypass_mode:
            self.backend.snapshot_params()

    def _restore(self, resume: dict[str, Any]) -> None:
        """Weights, optimizer and RNG from the checkpoint's trainer directory; version, step and counters."""
        self.backend.load(resume["trainer_dir"])
        st = resume["state"]
        self.version, self.local_step, self.since_sync = int(st["version"]), int(st["step"]), int(st["since_sync"])
        counters = st["trainer"]
        self.stale_processed = int(counters["stale_processed"])
        self.dropped_stale = int(counters["dropped_stale"])
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
            if not self._stop and self.cfg.trainer.test_freq:
                # the last version's validation score, as verl validates at the end of training
                ray.get(self.rollouter.final_validation.remote(self.version, self.local_step))
        except Exception:
            self.controller.record_event.remote(self._ev("error", "error", traceback.format_exc(limit=8)))
            self._checkpoint_after_failure()
            raise
        finally:
            self._finish()
        return {"local_step": self.local_step, "version": self.version, "stopped": self._stop_reason}

    def _step(self) -> bool:
        t_start = time.monotonic()
        groups = self._pull(self.required)
        wait_s = time.monotonic() - t_start
        if not groups:
            return False
        groups = self._filter_stale(groups)
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
        self.local_step += 1
        self.since_sync += 1
        if self.cfg.debug.kill_trainer_at_step == self.local_step:
            os._exit(17)  # fault injection ([debug] kill_trainer_at_step): the process dies mid-run
        self.ledger.record(prep.uids, "trained", step=self.local_step, version=self.version)
        self._current, self._weights_dirty = [], False
        rec.update(self._alarms(rec))
        if self._should_sync():
            rec.update(self._sync())
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
    def _pull(self, n: int) -> list:
        """`n` groups from the queue (in sync mode a whole cycle is generated before training starts)."""
        if self.sync_mode and not self._buffer and self.since_sync == 0:
            want = n * self.trigger
        else:
            want = max(0, n - len(self._buffer))
        while want > 0 and not self._closed and not self._stop:
            got, closed = ray.get(self.queue.get_batch.remote(want, 1.0))
            self._buffer.extend(got)
            want -= len(got)
            self._closed = closed
            if not got:
                self._apply_knobs()
        if self._stop and len(self._buffer) < n:
            return []  # stopping: no partial step; the buffer goes into the stop checkpoint
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _filter_stale(self, groups: list) -> list:
        """Hard version cap: with `stale_policy = "drop"` groups older than the cap are dropped and logged."""
        if self.cap is None or self.stale_policy != "drop":
            return groups
        keep, drop = [], []
        for g in groups:
            (drop if staleness_of(g, self.version) > self.cap else keep).append(g)
        if drop:
            self.dropped_stale += len(drop)
            uids = [g.prompt.uid for g in drop]
            self.ledger.record(uids, "dropped", step=self.local_step, version=self.version, reason="stale")
            self.controller.record_event.remote(self._ev(
                "warning", "drop", f"dropped {len(drop)} prompt(s) older than max_staleness_versions={self.cap}",
                uids=uids, reason="stale"))
        return keep

    def _staleness_bound(self) -> float:
        """The hard cap when set, else verl's nominal bound ceil(staleness_threshold) (0 in sync mode)."""
        if self.cap is not None:
            return float(self.cap)
        return 0.0 if self.sync_mode else float(math.ceil(self.cfg.async_training.staleness_threshold))

    # ------------------------------------------------------------------ sync
    def _should_sync(self) -> bool:
        if self.since_sync < self.trigger:
            return False
        if self.cap is not None and self.stale_policy == "wait":
            oldest = [v for v in (ray.get(self.rollouter.outstanding_min_version.remote()),
                                  ray.get(self.queue.min_version.remote())) if v is not None]
            if oldest and self.version + 1 - min(oldest) > self.cap:
                if not self._postponed:
                    self.controller.record_event.remote(self._ev(
                        "info", "sync", "sync postponed: outstanding work would exceed max_staleness_versions"))
                self._postponed = True
                return False
        self._postponed = False
        return True

    def _sync(self) -> dict[str, float]:
        """version += 1; push the weights (bucketed, by `rollout.weight_sync`'s transport) to every replica."""
        t0 = time.monotonic()
        self.version += 1
        self.since_sync = 0
        every = self.cfg.checkpoint.every_versions
        cut = bool(every) and self.version % every == 0  # a periodic checkpoint follows this step
        pending, nbytes = publish(self.weight_sync, self.version, self.backend.export_weights(self.bucket_bytes),
                                  lambda refs: self.rollouter.update_weights.remote(self.version, refs,
                                                                                    self.local_step, cut))
        export_s = time.monotonic() - t0
        out = ray.get(pending)
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
    def _apply_knobs(self) -> None:
        knobs = ray.get(self.controller.get_knobs.remote())
        k = knobs.get("trigger_parameter_sync_step")
        if k and k.get("pending"):
            self.trigger = int(k["value"])
            self.rollouter.set_trigger.remote(self.trigger)
            self.controller.ack_knob.remote("trigger_parameter_sync_step", k["version"], self.local_step)
        for action in ray.get(self.controller.take_actions.remote("trainer")):
            if action == "stop":
                self.request_stop("requested through the controller")
            elif action == "checkpoint":
                self._checkpoint_best_effort("on_demand")

    def _alarms(self, rec: dict[str, Any]) -> dict[str, Any]:
        from engine.algo.rc_diagnostics import mismatch_alarm

        msgs = mismatch_alarm(rec, self.rc.mismatch_kl_bound, self.rc.mismatch_ppl_ratio_bound,
                              self.rc.mismatch_chi2_bound)
        for m in msgs:
            self.controller.record_event.remote(self._ev("warning", "warning", m, alarm="mismatch"))
        return {"asyncrl/mismatch_alarm": float(bool(msgs))}

    # ------------------------------------------------------------------ checkpoints
    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary; the loop then writes a stop checkpoint (graceful, resumable)."""
        if not self._stop:
            self._stop, self._stop_reason = True, reason
            self.controller.record_event.remote(self._ev("info", "knob", f"graceful stop: {reason}"))

    def save_checkpoint(self, reason: str, snapshot: dict | None = None) -> str:
        """Write a checkpoint now (between steps). `snapshot` is a rollout-side cut taken at this step's sync;
        without one the rollouter is paused briefly to take it."""
        from engine.runtime.checkpoint import checkpoint_root, ledger_position, write_checkpoint
        from engine.runtime.resume import config_fingerprint

        if snapshot is None:
            snapshot = ray.get(self.rollouter.snapshot.remote(True))
        state = {
            "step": self.local_step, "version": self.version, "since_sync": self.since_sync, "reason": reason,
            "time": time.time(), "run_dir": os.path.abspath(self.run_dir),
            "fingerprint": config_fingerprint(self.cfg),
            **ledger_position(self.ledger.path),
            "trainer": {"stale_processed": self.stale_processed, "dropped_stale": self.dropped_stale,
                        "skipped_updates": self.skipped_updates, "elapsed_s": time.time() - self.t0},
            "rollout": snapshot["rollout"],
        }
        queued = [g.to_json() for g in self._current + self._buffer] + snapshot["queued"]
        path = write_checkpoint(checkpoint_root(self.cfg, self.run_dir), self.local_step,
                                save_trainer=lambda p: self.backend.save(str(p)), state=state, queued=queued,
                                in_flight=snapshot["in_flight"], keep_last=self.cfg.checkpoint.keep_last)
        self._last_ckpt_step = self.local_step
        self.controller.record_event.remote(self._ev(
            "info", "checkpoint", f"checkpoint saved ({reason}): {path}", path=str(path), reason=reason,
            queued=len(queued), in_flight=len(snapshot["in_flight"])))
        return str(path)

    def _checkpoint_best_effort(self, reason: str) -> None:
        """A stop/final/on-demand checkpoint; a failure is an event, not a crash (the last one stays)."""
        if reason in ("stop", "final") and self._last_ckpt_step == self.local_step:
            return  # this step is already saved
        try:
            self.save_checkpoint(reason)
        except Exception as e:  # noqa: BLE001 - reported, and the previous checkpoint remains usable
            self.controller.record_event.remote(self._ev(
                "error", "checkpoint", f"{reason} checkpoint failed: {type(e).__name__}: {e}"))

    def _checkpoint_after_failure(self) -> None:
        """After a step raised: save what is consistent (the step's groups go back to the buffer), unless
        the optimizer already changed the weights for a step that is not in the ledger."""
        if self._weights_dirty:
            self.controller.record_event.remote(self._ev(
                "error", "checkpoint", "no checkpoint at the failure: it happened during an optimizer step; "
                "resume from the previous checkpoint"))
            return
        self._buffer, self._current = self._current + self._buffer, []
        self._last_ckpt_step = None
        self._checkpoint_best_effort("failure")

    def _finish(self) -> None:
        """Stop the rollouter and account for every prompt still in flight or queued."""
        try:
            left = ray.get(self.rollouter.stop.remote())
            queued = [g.prompt.uid for g in ray.get(self.queue.drain.remote())]
            queued += [g.prompt.uid for g in self._current + self._buffer]
            self.ledger.record(left["in_flight"] + queued, "in_flight_at_end", step=self.local_step,
                               version=self.version)
            self.ledger.record(left["evicted"], "dropped", step=self.local_step, version=self.version,
                               reason="queue_overflow")
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
    out = {}
    for k, v in rec.items():
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v
    return out


@ray.remote(max_concurrency=2)
class Trainer:
    """Thin actor around `TrainerCore` (rank 0 of the trainer; `rank_options`: Ray options of the other ranks)."""

    def __init__(self, cfg: Any, model_dir: str, run_dir: str, queue: Any, rollouter: Any, controller: Any,
                 num_threads: int = 1, resume: dict | None = None,
                 rank_options: dict[str, Any] | None = None) -> None:
        import torch

        torch.set_num_threads(max(1, num_threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.core = TrainerCore(cfg, model_dir, run_dir, queue, rollouter, controller, resume,
                                rank_options=rank_options, num_threads=num_threads)

    def fit(self) -> dict[str, Any]:
        return self.core.fit()

    def request_stop(self, reason: str) -> None:
        self.core.request_stop(reason)

    def push_weights(self) -> None:
        """Resume: give the rollout replicas the restored weights before generation starts."""
        refs = [ray.put(b) for b in self.core.backend.export_weights(self.core.bucket_bytes)]
        ray.get(self.core.rollouter.load_weights.remote(self.core.version, refs))
