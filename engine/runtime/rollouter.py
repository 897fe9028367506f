"""The Rollouter: owns the prompt stream, admits prompts under the staleness budget, dispatches them to the
rollout replicas, scores finished groups and streams them into the MessageQueue.

Concurrency model: one dispatch thread (`_loop`) does all the streaming; the trainer calls `update_weights`
from another actor thread. A sync raises `_syncing`, which stops new dispatches; with `partial_rollout` the
replicas are aborted at the next token boundary and the partial sequences are resubmitted from their prefix
after the update (with the remaining token budget), otherwise the in-flight work finishes under the old
weights first. Each trajectory keeps the min and max weight version that generated it.

Reliability: a replica whose process dies (its `generate` raises `RayActorError`) has its requests put back
as pending and is replaced through the `ReplicaPool` (`rollout.max_replica_restarts`; when spent, `fit()`
returns a `failure` and the driver stops the run with a checkpoint). `snapshot()` / `restore()` (in
`rollout_checkpoint.py`) give the trainer a consistent cut of the rollout side for checkpoints.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import ray

from engine.rollout.base import SamplingParams
from engine.runtime.budget import StalenessBudget
from engine.runtime.prompt_stream import PromptStream
from engine.runtime.replica_pool import ReplicaPool, describe_failure
from engine.runtime.rollout_checkpoint import RolloutCheckpointMixin
from engine.runtime.rollout_failures import RolloutFailureMixin
from engine.runtime.rollout_state import InFlight, request_id
from engine.types import GenRequest, GenResult, Prompt, Trajectory, TrajectoryGroup

REWARD_ERROR_REPORTS = (1, 10, 100, 1000, 10000)
"""Reward-failure counts at which an event is written (the counter `asyncrl/reward/errors` has them all)."""


@dataclass
class _Dispatch:
    replica: int
    kind: str  # "train" | "val"
    started: float
    requests: list[GenRequest] = field(default_factory=list)


class RolloutCore(RolloutCheckpointMixin, RolloutFailureMixin):
    """Streaming logic of the rollouter (runs inside the `Rollouter` actor).

    `replica_spec` (`{"options": ray actor options, "threads": n}`) lets it start replacement replicas;
    `resume_state` is a checkpoint's rollout part (`{"rollout", "queued", "in_flight"}`)."""

    def __init__(self, cfg: Any, model_dir: str, queue: Any, controller: Any, replicas: list[Any],
                 resume_state: dict | None = None, replica_spec: dict | None = None) -> None:
        from asyncrl_cli.config.derived import max_queue_size, required_samples, total_rollout_steps
        from engine.data.prompts import load_prompts
        from engine.models.loader import load_tokenizer
        from engine.runtime.scoring import Scorer

        self.cfg = cfg
        self.queue = queue
        self.controller = controller
        self.pool = ReplicaPool(replicas, _spawner(cfg, model_dir, replica_spec), cfg.rollout.max_replica_restarts)
        self.tokenizer = load_tokenizer(model_dir)
        self.scorer = Scorer(cfg, self.tokenizer)
        ac = cfg.async_training
        staleness = 0.0 if ac.mode == "sync" else ac.staleness_threshold
        self.budget = StalenessBudget(required_samples(cfg), staleness, ac.trigger_parameter_sync_step)
        self.max_queue_size = max_queue_size(cfg)
        self.partial_rollout = ac.partial_rollout and ac.mode != "sync"
        self.n = cfg.rollout.n
        self.max_new = cfg.data.max_response_length
        self.sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k, cfg.trainer.seed)
        self.val_sampling = SamplingParams(cfg.rollout.val_temperature, 1.0, 0, cfg.trainer.seed)
        self.seqs_per_call = max(self.n, cfg.rollout.max_num_seqs)

        self._counters: dict[str, int] = {}
        self._filtered_reported = False
        train_cache: dict[int, list[Prompt]] = {}

        def prompts_for_epoch(epoch: int) -> list[Prompt]:
            if epoch not in train_cache:
                train_cache.clear()
                prompts, counters = load_prompts(cfg.data, self.tokenizer, split="train", epoch=epoch)
                for k, v in counters.items():
                    self._counters[f"data/{k}"] = v
                self._report_filtered(epoch, counters)
                train_cache[epoch] = prompts
            return train_cache[epoch]

        self.stream = PromptStream(prompts_for_epoch, cfg.trainer.total_epochs, total_rollout_steps(cfg))
        self.val_prompts: list[Prompt] = []
        if cfg.data.val_files and cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train:
            if cfg.data.val_files:
                self.val_prompts, _ = load_prompts(cfg.data, self.tokenizer, split="val", epoch=0)
                if cfg.data.val_max_samples:
                    self.val_prompts = self.val_prompts[: cfg.data.val_max_samples]

        self.version = 0
        self.step = 0
        self.lock = threading.Condition()
        self.in_flight: dict[str, InFlight] = {}
        self.dispatch: dict[Any, _Dispatch] = {}  # ObjectRef -> dispatch info
        self.busy: set[int] = set()
        self._syncing = False
        self._snapshotting = False
        self._running = False
        self.failure: str | None = None  # set when the replica failure budget is spent
        self._kill_at = cfg.debug.kill_replica_at_step or 0
        self._killed = False
        self._reward_errors_seen = 0
        self._paused = False
        self._stopped = False
        self._closed = False
        self._error: str | None = None
        self._val_pending: list[GenRequest] = []
        self._val_results: dict[str, GenResult] = {}
        self._val_version = 0
        self._queue_size = 0
        self._stream_empty = False
        self.evicted_uids: list[str] = []
        self._trainer_trigger: int | None = None
        self._pending_staleness: tuple[float, int] | None = None
        # counters (verl names where they exist)
        self.total_generated = 0  # prompts finished and put into the queue
        self.dropped = 0
        self.tokens_since_report = 0
        self.last_report = time.monotonic()
        self.version_started = time.monotonic()
        self.active_s = 0.0
        self._last_knob_poll = 0.0
        self._last_worker_push = 0.0
        if resume_state:
            self.restore(resume_state)
            self._killed = bool(self._kill_at) and self.step >= self._kill_at
        if cfg.trainer.val_before_train and self.val_prompts:
            self._queue_validation(self.version)

    # ------------------------------------------------------------------ dispatch loop
    def run(self) -> None:
        """The dispatch thread, until stop() (or a replica failure beyond the restart budget). Once the stream is
        exhausted and every prompt finished it closes the queue and keeps serving validation only."""
        self._running = True
        try:
            while True:
                self._poll_knobs()
                self._collect(timeout=0.02)
                with self.lock:
                    self._poll_pool()
                    if self._stopped or self.failure:
                        return
                    if not self._closed and self._exhausted():
                        # the trainer drains the queue and stops us; until then validation requests are served
                        self._closed = True
                        ray.get(self.queue.close.remote())
                        self._event("info", "finish", "prompt stream exhausted; queue closed")
                    self._dispatch_idle()
                self._push_workers()
                if not self.dispatch:
                    time.sleep(0.01)
        except Exception as e:  # surfaced through fit() to the driver
            self._error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            raise
        finally:
            with self.lock:
                self._running = False
                self.lock.notify_all()

    def _exhausted(self) -> bool:
        return (self.stream.emitted >= self.stream.total or self._stream_empty) and not self.in_flight \
            and not self.dispatch and not self._val_pending

    def _dispatch_idle(self) -> None:
        """Give each idle replica a batch: validation first, then resumed prefixes, then new prompts."""
        if self._syncing or self._snapshotting:
            return
        for rid in self.pool.live():
            replica = self.pool.replicas[rid]
            if rid in self.busy:
                continue
            if self._val_pending:
                reqs, self._val_pending = self._val_pending[: self.seqs_per_call], self._val_pending[self.seqs_per_call:]
                self._send(rid, replica, reqs, "val")
                continue
            reqs = self._take_pending(self.seqs_per_call)
            if not self._paused:
                reqs += self._admit(self.seqs_per_call - len(reqs))
            if reqs:
                self._send(rid, replica, reqs, "train")

    def _send(self, rid: int, replica: Any, reqs: list[GenRequest], kind: str) -> None:
        sampling = self.val_sampling if kind == "val" else self.sampling
        ref = replica.generate.remote(reqs, sampling)
        self.dispatch[ref] = _Dispatch(rid, kind, time.monotonic(), list(reqs))
        self.busy.add(rid)

    def _take_pending(self, capacity: int) -> list[GenRequest]:
        out: list[GenRequest] = []
        for st in self.in_flight.values():
            for idx in list(st.pending):
                if len(out) >= capacity:
                    return out
                out.append(st.pending.pop(idx))
                st.running.add(idx)
        return out

    def _admit(self, capacity: int) -> list[GenRequest]:
        out: list[GenRequest] = []
        while capacity - len(out) >= self.n and self.budget.can_admit(self._queue_size, self.max_queue_size):
            p = self.stream.next()
            if p is None:
                self._stream_empty = True
                break
            self.budget.admit()
            st = InFlight(p, time.monotonic(), self.version)
            for i in range(self.n):
                st.running.add(i)
                out.append(GenRequest(request_id(p.uid, i), p.prompt_ids, max_new_tokens=self.max_new,
                                      images=p.images))
            self.in_flight[p.uid] = st
        return out

    # ------------------------------------------------------------------ results
    def _collect(self, timeout: float) -> None:
        refs = list(self.dispatch)
        if not refs:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in ready:
            try:
                results = ray.get(ref)
            except ray.exceptions.RayActorError as e:  # the replica's process died
                with self.lock:
                    info = self.dispatch.pop(ref)
                    self.busy.discard(info.replica)
                    self._requeue(info)
                    self._replica_failed(info.replica, describe_failure(e), len(info.requests))
                    self.lock.notify_all()
                continue
            with self.lock:
                info = self.dispatch.pop(ref)
                self.busy.discard(info.replica)
                self.active_s += time.monotonic() - info.started
                self.tokens_since_report += sum(r.new_tokens for r in results)
                if info.kind == "val":
                    self._on_val_results(results)
                else:
                    self._on_train_results(results)
                self.lock.notify_all()

    def _on_train_results(self, results: list[GenResult]) -> None:
        finished: list[InFlight] = []
        for r in results:
            uid, idx = r.request_id.rsplit("#", 1)
            st = self.in_flight.get(uid)
            if st is None:  # stopped meanwhile
                continue
            i = int(idx)
            st.running.discard(i)
            if r.finish_reason == "abort":
                if self._stopped:
                    continue
                remaining = self.max_new - len(r.response_ids)
                st.pending[i] = GenRequest(r.request_id, st.prompt.prompt_ids, images=st.prompt.images,
                                           prefix_ids=list(r.response_ids),
                                           prefix_log_probs=list(r.log_probs), max_new_tokens=remaining,
                                           min_version=r.min_version)
                continue
            st.done[i] = Trajectory(list(r.response_ids), list(r.log_probs), r.finish_reason,
                                    r.min_version, r.max_version)
            if len(st.done) == self.n:
                finished.append(st)
        for st in finished:
            del self.in_flight[st.prompt.uid]
            trajs = [st.done[i] for i in range(self.n)]
            self.scorer.score_group(st.prompt, trajs)
            self._report_reward_errors()
            group = TrajectoryGroup(st.prompt, trajs, generated_at=time.time(),
                                    gen_seconds=time.monotonic() - st.admitted_at,
                                    admitted_version=st.admitted_version)
            evicted = ray.get(self.queue.put.remote(group))
            self._queue_size += 1
            self.total_generated += 1
            if evicted is not None:
                self.dropped += 1
                self._queue_size -= 1
                self._event("warning", "drop", f"queue full: evicted prompt {evicted.prompt.uid}",
                            uid=evicted.prompt.uid, reason="queue_overflow")
                self.evicted_uids.append(evicted.prompt.uid)

    def _report_filtered(self, epoch: int, counters: dict[str, int]) -> None:
        """An event when rendering dropped prompts (empty, or over data.max_prompt_length): once per run."""
        dropped = counters.get("filtered_empty", 0) + counters.get("filtered_overlong", 0)
        if dropped and not self._filtered_reported:
            self._filtered_reported = True
            self._event("warning", "data", f"{dropped} of {counters.get('rows', 0)} training prompts filtered out "
                        f"in epoch {epoch}: {counters.get('filtered_empty', 0)} empty, "
                        f"{counters.get('filtered_overlong', 0)} over data.max_prompt_length "
                        "(counters data/filtered_*)", **{k: v for k, v in counters.items() if k.startswith("filtered")})

    def _report_reward_errors(self) -> None:
        """An event when the reward function's failure count reaches 1, 10, 100, ... (scored 0.0 each)."""
        errors = self.scorer.errors
        crossed = [k for k in REWARD_ERROR_REPORTS if self._reward_errors_seen < k <= errors]
        self._reward_errors_seen = errors
        if crossed:
            self._event("warning", "reward", f"the reward function failed on {errors} response(s) so far; each "
                        f"scored 0.0 (last: {self.scorer.last_error})", errors=errors)

    def _on_val_results(self, results: list[GenResult]) -> None:
        for r in results:
            self._val_results[r.request_id] = r
        if len(self._val_results) < len(self.val_prompts):
            return
        by_uid = {p.uid: p for p in self.val_prompts}
        per_source: dict[str, list[float]] = {}
        for rid, r in self._val_results.items():
            p = by_uid[rid.rsplit("#", 1)[0]]
            acc = self.scorer.accuracy(p, r.response_ids, r.finish_reason)
            per_source.setdefault(p.data_source or "val", []).append(acc)
        self._val_results = {}
        rec: dict[str, Any] = {"training/global_step": self.step,
                               "fully_async/count/current_param_version": self._val_version}
        for src, xs in per_source.items():
            rec[f"val-core/{src}/reward/mean@1"] = sum(xs) / len(xs)
        self.controller.record_metrics.remote(rec)
        summary = ", ".join(f"{src}={sum(xs) / len(xs):.3f}" for src, xs in per_source.items())
        self._event("info", "validation", f"validation at version {self._val_version}: {summary}")

    def final_validation(self, version: int, step: int, timeout_s: float = 1800.0) -> None:
        """Validate `version` unless that already happened, and wait (bounded) until its record is written."""
        with self.lock:
            if not self.val_prompts or self._stopped or not self._running:
                return
            self.step = step
            if self._val_version != version:
                self._queue_validation(version)
            deadline = time.monotonic() + timeout_s
            while (self._val_pending or self._val_results or self._val_running()) and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(min(left, 0.5))

    def _val_running(self) -> bool:
        return any(d.kind == "val" for d in self.dispatch.values())

    def _queue_validation(self, version: int) -> None:
        self._val_version = version
        self._val_results = {}
        self._val_pending = [GenRequest(f"{p.uid}#0", p.prompt_ids, max_new_tokens=self.max_new, images=p.images)
                             for p in self.val_prompts]

    # ------------------------------------------------------------------ sync (called from the trainer)
    def update_weights(self, version: int, bucket_refs: list, step: int,
                       snapshot: bool = False) -> dict[str, Any]:
        """Pause → (abort in-flight | let it finish) → load weights on every live replica → resume. With
        `snapshot`, the rollout side's checkpoint state is taken while paused (under key `snapshot`)."""
        t0 = time.monotonic()
        with self.lock:
            self._syncing = True
            busy = sorted({d.replica for d in self.dispatch.values()})
        if self.partial_rollout:
            self._wait_signal(busy, "abort")
        with self.lock:
            while self.dispatch and not self._stopped and self._running:
                self.lock.wait(0.05)
        pause_s = time.monotonic() - t0
        t1 = time.monotonic()
        dead = self.pool.update_live(bucket_refs, version)
        transfer_s = time.monotonic() - t1
        with self.lock:
            for rid, cause in dead:
                self._replica_failed(rid, cause)
            now = time.monotonic()
            version_time = max(1e-9, now - self.version_started)
            metrics: dict[str, Any] = {
                "fully_async/rollouter/active_time": self.active_s,
                "fully_async/rollouter/version_time": version_time,
                "fully_async/rollouter/idle_ratio": max(0.0, 1.0 - self.active_s / (version_time * len(self.pool))),
                "asyncrl/sync/pause_s": pause_s,
                "asyncrl/sync/transfer_s": transfer_s,
            }
            self.version = version
            self.step = step
            self.version_started, self.active_s = now, 0.0
            self._queue_size = ray.get(self.queue.size.remote())
            trigger, staleness = self._knob_values_for_sync(step)
            self.budget.on_sync(len(self.in_flight), self._queue_size, trigger=trigger,
                                staleness_threshold=staleness)
            tf = self.cfg.trainer.test_freq
            if tf and self.val_prompts and version % tf == 0:
                self._queue_validation(version)
            if snapshot:
                metrics["snapshot"] = self._snapshot_locked()
            self._syncing = False
            self.lock.notify_all()
        return metrics

    def load_weights(self, version: int, bucket_refs: list) -> None:
        """Before the loop starts on resume: give every replica the restored weights (they load the base)."""
        dead = self.pool.update_live(bucket_refs, version)
        with self.lock:
            self.version = version
            for rid, cause in dead:
                self._replica_failed(rid, cause)

    def _wait_signal(self, rids: list[int], method: str) -> None:
        """`abort`/`resume` the given replicas and wait until each took it (a dead one is noticed elsewhere)."""
        refs = self.pool.signal(rids, method)
        for ref in refs:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass

    def _knob_values_for_sync(self, step: int) -> tuple[int | None, float | None]:
        """The trigger the trainer now uses, and a pending staleness_threshold change (acknowledged here)."""
        trigger = self._trainer_trigger
        staleness = None
        if self._pending_staleness is not None and self.cfg.async_training.mode != "sync":
            value, kv = self._pending_staleness
            staleness = value
            self._pending_staleness = None
            self.controller.ack_knob.remote("staleness_threshold", kv, step)
        return trigger, staleness

    def set_trigger(self, trigger: int) -> None:
        """The trainer tells the rollouter its new sync interval; the budget uses it from the next sync."""
        self._trainer_trigger = trigger

    def _poll_knobs(self) -> None:
        now = time.monotonic()
        if now - self._last_knob_poll < 0.5:
            return
        self._last_knob_poll = now
        knobs = ray.get(self.controller.get_knobs.remote())
        paused = knobs.get("paused")
        if paused and bool(paused["value"]) != self._paused:
            with self.lock:
                self._paused = bool(paused["value"])
            if paused.get("pending"):
                self.controller.ack_knob.remote("paused", paused["version"], self.step)
        st = knobs.get("staleness_threshold")
        if st and st.get("pending") and (self._pending_staleness is None or self._pending_staleness[1] != st["version"]):
            self._pending_staleness = (float(st["value"]), st["version"])

    def _push_workers(self) -> None:
        now = time.monotonic()
        if now - self._last_worker_push < 1.0:
            return
        self._last_worker_push = now
        for rid in range(len(self.pool)):
            state = "restarting" if rid in self.pool.down else "syncing" if self._syncing else \
                "paused" if self._paused else "busy" if rid in self.busy else "idle"
            self.controller.update_worker.remote(f"rollout-{rid}", {"kind": "rollout", "state": state,
                                                                    "version": self.version})

    # ------------------------------------------------------------------ reports, stop, checkpoint
    def report(self, step: int | None = None) -> dict[str, float]:
        """Counters for the trainer's per-step record (`step`: the trainer's local step just finished)."""
        with self.lock:
            if step is not None:
                self.step = step
                self._maybe_kill_replica(step)
            now = time.monotonic()
            dt = max(1e-9, now - self.last_report)
            tps = self.tokens_since_report / dt
            self.tokens_since_report, self.last_report = 0, now
            return {
                "fully_async/count/total_generated_samples": self.total_generated,
                "fully_async/count/staleness_samples": self.budget.staleness_samples,
                "fully_async/count/dropped_stale_samples": self.dropped,
                "fully_async/monitor/active_tasks_size": len(self.in_flight),
                "fully_async/static/max_required_samples": self.budget.limit,
                "asyncrl/rollout/tokens_per_s": tps,
                "asyncrl/rollout/version": self.version,
                "asyncrl/rollout/replica_restarts": self.pool.restarts,
                **self._counters,
                **self.scorer.counters(),
            }

    def outstanding_min_version(self) -> int | None:
        """Oldest version still feeding an unfinished prompt (for the `wait` stale policy)."""
        with self.lock:
            vs = [t.min_version for st in self.in_flight.values() for t in st.done.values()]
            vs += [r.min_version for st in self.in_flight.values() for r in st.pending.values()
                   if r.min_version is not None]
            vs += [st.admitted_version for st in self.in_flight.values()]
            return min(vs, default=None)

    def stop(self) -> dict[str, list[str]]:
        """Stop streaming; abort replicas. Returns the uids still in flight and those evicted from a full
        queue (for the ledger)."""
        with self.lock:
            self._stopped = True
            uids = list(self.in_flight)
            self.lock.notify_all()
        self.pool.signal(self.pool.live(), "abort")
        return {"in_flight": uids, "evicted": list(self.evicted_uids)}

    def _event(self, level: str, kind: str, message: str, **extra: Any) -> None:
        self.controller.record_event.remote({"time": time.time(), "kind": kind, "level": level,
                                             "step": self.step, "version": self.version,
                                             "message": message, **extra})


def _spawner(cfg: Any, model_dir: str, spec: dict | None):
    """A function starting a replacement replica in slot `rid` (None without a spec: no restarts)."""
    if spec is None:
        return None

    def spawn(rid: int) -> Any:
        from engine.runtime.replica import RolloutReplica

        opts = spec["options"][rid] if isinstance(spec["options"], list) else spec["options"]  # per slot: its bundles
        return RolloutReplica.options(**opts).remote(cfg, model_dir, rid, spec["threads"])

    return spawn


@ray.remote(num_cpus=0, max_concurrency=8)
class Rollouter:
    """Thin actor around `RolloutCore`; `fit()` runs the dispatch loop until the stream ends or `stop()`."""

    def __init__(self, cfg: Any, model_dir: str, queue: Any, controller: Any, replicas: list[Any],
                 resume_state: dict | None = None, replica_spec: dict | None = None) -> None:
        self.core = RolloutCore(cfg, model_dir, queue, controller, replicas, resume_state, replica_spec)

    def fit(self) -> dict[str, Any]:
        """Run the dispatch loop; `failure` is set when it stopped because replicas kept dying."""
        self.core.run()
        return {"in_flight": list(self.core.in_flight), "evicted": list(self.core.evicted_uids),
                "failure": self.core.failure}

    def update_weights(self, version: int, bucket_refs: list, step: int, snapshot: bool = False) -> dict[str, Any]:
        return self.core.update_weights(version, bucket_refs, step, snapshot)

    def load_weights(self, version: int, bucket_refs: list) -> None:
        self.core.load_weights(version, bucket_refs)

    def snapshot(self, drain: bool = True) -> dict[str, Any]:
        return self.core.snapshot(drain)

    def set_trigger(self, trigger: int) -> None:
        self.core.set_trigger(trigger)

    def report(self, step: int | None = None) -> dict[str, float]:
        return self.core.report(step)

    def outstanding_min_version(self) -> int | None:
        return self.core.outstanding_min_version()

    def final_validation(self, version: int, step: int) -> None:
        self.core.final_validation(version, step)

    def stop(self) -> dict[str, list[str]]:
        return self.core.stop()
