"""The Rollouter: owns the prompt stream, admits prompts under the staleness budget, dispatches them to the
rollout replicas, scores finished groups and streams them into the MessageQueue.

Concurrency model: one dispatch thread (`_loop`) does all the streaming; the trainer calls `update_weights`
from another actor thread. A sync raises `_syncing`, which stops new dispatches; with `partial_rollout` the
replicas are aborted at the next token boundary and the partial sequences are resubmitted from their prefix
after the update (with the remaining token budget), otherwise the in-flight work finishes under the old
weights first. Each trajectory keeps the min and max weight version that generated it.
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
from engine.types import GenRequest, GenResult, Prompt, Trajectory, TrajectoryGroup


@dataclass
class _InFlight:
    """A prompt whose `n` trajectories are being generated."""

    prompt: Prompt
    admitted_at: float
    admitted_version: int
    done: dict[int, Trajectory] = field(default_factory=dict)
    pending: dict[int, GenRequest] = field(default_factory=dict)  # waiting for (re)dispatch
    running: set[int] = field(default_factory=set)  # on a replica now


@dataclass
class _Dispatch:
    replica: int
    kind: str  # "train" | "val"
    started: float


class PromptStream:
    """The prompts of epoch 0, 1, ... in the order `load_prompts` gives (it shuffles per epoch, seeded), capped
    at `total` prompts. The order is a pure function of (seed, epoch), so a position restores exactly."""

    def __init__(self, prompts_for_epoch, total_epochs: int, total: int) -> None:
        self._for_epoch = prompts_for_epoch
        self.total_epochs = total_epochs
        self.total = total
        self.emitted = 0
        self._epoch = -1
        self._order: list[Prompt] = []
        self._pos = 0

    def next(self) -> Prompt | None:
        if self.emitted >= self.total:
            return None
        if self._pos >= len(self._order):
            self._epoch += 1
            if self._epoch >= self.total_epochs:
                return None
            self._order = list(self._for_epoch(self._epoch))
            self._pos = 0
            if not self._order:
                return None
        p = self._order[self._pos]
        self._pos += 1
        self.emitted += 1
        return p

    def state(self) -> dict[str, int]:
        return {"epoch": self._epoch, "pos": self._pos, "emitted": self.emitted}

    def restore(self, state: dict[str, int]) -> None:
        """Fast-forward to a saved position (the order is a pure function of seed and epoch)."""
        self._epoch = state["epoch"]
        if self._epoch >= 0:
            self._order = list(self._for_epoch(self._epoch))
        self._pos = state["pos"]
        self.emitted = state["emitted"]


class RolloutCore:
    """Streaming logic of the rollouter (runs inside the `Rollouter` actor)."""

    def __init__(self, cfg: Any, model_dir: str, queue: Any, controller: Any, replicas: list[Any],
                 resume_state: dict | None = None) -> None:
        from asyncrl_cli.config.derived import max_queue_size, required_samples, total_rollout_steps
        from engine.data.prompts import load_prompts
        from engine.models.loader import load_tokenizer
        from engine.runtime.scoring import Scorer

        self.cfg = cfg
        self.queue = queue
        self.controller = controller
        self.replicas = replicas
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
        train_cache: dict[int, list[Prompt]] = {}

        def prompts_for_epoch(epoch: int) -> list[Prompt]:
            if epoch not in train_cache:
                train_cache.clear()
                prompts, counters = load_prompts(cfg.data, self.tokenizer, split="train", epoch=epoch)
                for k, v in counters.items():
                    self._counters[f"data/{k}"] = v
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
        self.in_flight: dict[str, _InFlight] = {}
        self.dispatch: dict[Any, _Dispatch] = {}  # ObjectRef -> dispatch info
        self.busy: set[int] = set()
        self._syncing = False
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
            self._restore(resume_state)
        if cfg.trainer.val_before_train and self.val_prompts:
            self._queue_validation(self.version)

    # ------------------------------------------------------------------ dispatch loop
    def run(self) -> None:
        """The dispatch thread: until the stream is exhausted and every prompt is finished, or stop()."""
        try:
            while True:
                self._poll_knobs()
                self._collect(timeout=0.02)
                with self.lock:
                    if self._stopped:
                        return
                    if self._exhausted():
                        if not self._closed:
                            self._closed = True
                            ray.get(self.queue.close.remote())
                            self._event("info", "finish", "prompt stream exhausted; queue closed")
                        return
                    self._dispatch_idle()
                self._push_workers()
                if not self.dispatch:
                    time.sleep(0.01)
        except Exception as e:  # surfaced through fit() to the driver
            self._error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            raise

    def _exhausted(self) -> bool:
        return (self.stream.emitted >= self.stream.total or self._stream_empty) and not self.in_flight \
            and not self.dispatch and not self._val_pending

    def _dispatch_idle(self) -> None:
        """Give each idle replica a batch: validation first, then resumed prefixes, then new prompts."""
        if self._syncing:
            return
        for rid, replica in enumerate(self.replicas):
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
        self.dispatch[ref] = _Dispatch(rid, kind, time.monotonic())
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
            st = _InFlight(p, time.monotonic(), self.version)
            for i in range(self.n):
                st.running.add(i)
                out.append(GenRequest(f"{p.uid}#{i}", p.prompt_ids, max_new_tokens=self.max_new))
            self.in_flight[p.uid] = st
        return out

    # ------------------------------------------------------------------ results
    def _collect(self, timeout: float) -> None:
        refs = list(self.dispatch)
        if not refs:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in ready:
            results = ray.get(ref)  # raises if the replica died: the driver reports it
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
        finished: list[_InFlight] = []
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
                st.pending[i] = GenRequest(r.request_id, st.prompt.prompt_ids, prefix_ids=list(r.response_ids),
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

    def _queue_validation(self, version: int) -> None:
        self._val_version = version
        self._val_results = {}
        self._val_pending = [GenRequest(f"{p.uid}#0", p.prompt_ids, max_new_tokens=self.max_new)
                             for p in self.val_prompts]

    # ------------------------------------------------------------------ sync (called from the trainer)
    def update_weights(self, version: int, bucket_refs: list, step: int) -> dict[str, float]:
        """Pause → (abort in-flight | let it finish) → load weights on every replica → resume."""
        t0 = time.monotonic()
        with self.lock:
            self._syncing = True
            busy = [self.replicas[i] for i in self.busy]
        if self.partial_rollout:
            for r in busy:
                r.abort.remote()
        with self.lock:
            while self.dispatch and not self._stopped:
                self.lock.wait(0.05)
        pause_s = time.monotonic() - t0
        t1 = time.monotonic()
        ray.get([r.update_weights.remote(bucket_refs, version) for r in self.replicas])
        transfer_s = time.monotonic() - t1
        with self.lock:
            now = time.monotonic()
            version_time = max(1e-9, now - self.version_started)
            metrics = {
                "fully_async/rollouter/active_time": self.active_s,
                "fully_async/rollouter/version_time": version_time,
                "fully_async/rollouter/idle_ratio": max(0.0, 1.0 - self.active_s / (version_time * len(self.replicas))),
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
            self._syncing = False
            self.lock.notify_all()
        return metrics

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
        for rid in range(len(self.replicas)):
            self.controller.update_worker.remote(f"rollout-{rid}", {
                "kind": "rollout", "state": "syncing" if self._syncing else ("paused" if self._paused else
                                                                              ("busy" if rid in self.busy else "idle")),
                "version": self.version})

    # ------------------------------------------------------------------ reports, stop, checkpoint
    def report(self) -> dict[str, float]:
        """Counters for the trainer's per-step record."""
        with self.lock:
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
        for r in self.replicas:
            r.abort.remote()
        return {"in_flight": uids, "evicted": list(self.evicted_uids)}

    def _event(self, level: str, kind: str, message: str, **extra: Any) -> None:
        self.controller.record_event.remote({"time": time.time(), "kind": kind, "level": level,
                                             "step": self.step, "version": self.version,
                                             "message": message, **extra})

    def _restore(self, state: dict) -> None:
        self.version = state["version"]
        self.step = state.get("step", 0)
        self.stream.restore(state["stream"])


@ray.remote(num_cpus=0, max_concurrency=8)
class Rollouter:
    """Thin actor around `RolloutCore`; `fit()` runs the dispatch loop until the stream ends or `stop()`."""

    def __init__(self, cfg: Any, model_dir: str, queue: Any, controller: Any, replicas: list[Any],
                 resume_state: dict | None = None) -> None:
        self.core = RolloutCore(cfg, model_dir, queue, controller, replicas, resume_state)

    def fit(self) -> dict[str, Any]:
        self.core.run()
        return {"in_flight": list(self.core.in_flight), "evicted": list(self.core.evicted_uids)}

    def update_weights(self, version: int, bucket_refs: list, step: int) -> dict[str, float]:
        return self.core.update_weights(version, bucket_refs, step)

    def set_trigger(self, trigger: int) -> None:
        self.core.set_trigger(trigger)

    def report(self) -> dict[str, float]:
        return self.core.report()

    def outstanding_min_version(self) -> int | None:
        return self.core.outstanding_min_version()

    def stop(self) -> dict[str, list[str]]:
        return self.core.stop()

    def stream_state(self) -> dict[str, int]:
        return self.core.stream.state()
