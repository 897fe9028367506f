"""The `hf` rollout backend: the project's own continuously batched sampler over a transformers causal LM.

`generate` turns requests into rows (context = prompt + resumed prefix, budget = `max_new_tokens`) and hands
them to the backend's running batch (`engine.rollout.hf.continuous.ContinuousBatcher`): at most
`max_batch_size` rows run at once, new rows join at the next decode step (one prefill per distinct context,
so the `n` samples of a prompt share it), finished rows leave at once. `generate` may be called from several
threads at the same time; each call returns when its own rows are finished or aborted (its `should_abort`
is polled at every token boundary). `capacity()` is the number of rows a new request could take now.
Results come back in request order as the *whole* response: `prefix_ids + new tokens`,
`prefix_log_probs + new log-probs`.

Deterministic mode (`deterministic=True`, for `trainer.deterministic`): calls run one at a time and each
prompt's rows are generated as a batch of their own with draws keyed by (seed, request id, position)
(`engine.rollout.hf.keyed`) instead of joining the running batch; an abort is honoured between groups only.

Precision: `dtype` (the replica's `rollout.dtype`) may differ from the trainer's; `update_weights` casts
the synced arrays to it on load.

Version stamps: `max_version` is the version loaded when the row finished; `min_version` is the request's
when it resumes a non-empty prefix, else the version loaded when the row started. `update_weights` replaces
weights in place between two decode steps (the replica normally aborts or drains generation first).
`stage_weights` + `swap_weights` do the same in two halves (`rollout.weight_sync_back_buffer`,
`engine.sync.staging`): the new weights are copied into a back buffer while generation still runs on the old
ones, and go live by a storage swap between two decode steps — rows generated before the swap carry the old
version, rows started after it the new one.

Images: a vision-language model (Qwen3-VL, `engine.multimodal`) takes `GenRequest.images` with the prompt —
a resumed request carries them again with its prefix. The pixel values come from the model directory's
image processor (`image_encoder`, loaded on first use from `model.name_or_path` when not given). A request
whose image tokens do not match its images is refused with `ValueError` (counted as `image_mismatch`);
a request with images on a text-only model likewise.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from engine.multimodal.placeholders import PlaceholderMismatch, check_image_tokens
from engine.multimodal.vision import ImageEncoder, VisionSpec, model_dir_of
from engine.rollout.base import SamplingParams, account_results, new_rollout_stats
from engine.rollout.hf.continuous import BatchCall, ContinuousBatcher
from engine.rollout.hf.decode import DecodeCounters, ForwardAdapter, MultimodalForward, RowOutput, RowSpec
from engine.rollout.hf.keyed import generate_alone, split_groups
from engine.sync.apply import load_buckets_into
from engine.sync.staging import BackBuffer, weights_nbytes
from engine.sync.verify import weights_fingerprint
from engine.types import GenRequest, GenResult


def _never() -> bool:
    return False


class HFRolloutBackend:
    """`RolloutBackend` over any transformers `*ForCausalLM` (eval mode, no grad)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_id: int | Iterable[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        image_encoder: ImageEncoder | None = None,
        deterministic: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.device = torch.device(device)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        self.model.eval()
        self.eos_ids = {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}
        if not self.eos_ids:
            raise ValueError("at least one eos_token_id is required")
        self._eos_tensor = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self.device)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = int(max_batch_size)
        self.version = 0
        self.vision = VisionSpec.from_config(getattr(self.model, "config", None))
        self._encoder = image_encoder
        self._forward = ForwardAdapter(self.model) if self.vision is None else MultimodalForward(self.model, image_encoder)
        self._counters = DecodeCounters()
        self._stats: dict[str, float] = new_rollout_stats("image_mismatch")
        self._model_lock = threading.RLock()
        self._stage_lock = threading.Lock()
        self._back: BackBuffer | None = None  # staged weight syncs (`stage_weights`), allocated at the first
        self._stats_lock = threading.Lock()
        self.deterministic = bool(deterministic)
        self._alone_lock = threading.Lock()  # deterministic mode: one call at a time
        self._alone_seconds = 0.0
        self._batcher = ContinuousBatcher(self._forward, eos_ids=self._eos_tensor, pad_id=self.pad_token_id,
                                          device=self.device, max_rows=self.max_batch_size,
                                          counters=self._counters, model_lock=self._model_lock,
                                          version=lambda: self.version)

    # --- generation -------------------------------------------------------------------------------------
    def generate(
        self,
        requests: list[GenRequest],
        sampling: SamplingParams,
        should_abort: Callable[[], bool] = _never,
    ) -> list[GenResult]:
        """Generate every request to EOS or its remaining budget; see `RolloutBackend.generate`. Thread-safe:
        concurrent calls share the running batch."""
        start = time.perf_counter()
        outputs: list[RowOutput | None] = [None] * len(requests)
        pending: list[int] = []
        for i, req in enumerate(requests):
            self._check(req)
            if req.prefix_ids and req.prefix_ids[-1] in self.eos_ids:
                outputs[i] = RowOutput(finish_reason="stop")
            elif req.max_new_tokens <= 0:
                outputs[i] = RowOutput(finish_reason="length")
            else:
                pending.append(i)
        specs = [RowSpec(requests[i].prompt_ids + requests[i].prefix_ids, requests[i].max_new_tokens,
                         tuple(requests[i].images)) for i in pending]
        started: list[int | None] = [None] * len(requests)
        if self.deterministic:
            self._generate_alone([requests[i] for i in pending], specs, sampling, should_abort, pending, outputs,
                                 started)
        else:
            call = BatchCall(specs, sampling, should_abort, self._generator(sampling.seed))
            self._batcher.run(call)
            for k, i in enumerate(pending):
                outputs[i], started[i] = call.outputs[k], call.start_versions[k]
        results = [self._result(req, out, v) for req, out, v in zip(requests, outputs, started)]
        self._account(results, time.perf_counter() - start)
        return results

    def _generate_alone(self, reqs: list[GenRequest], specs: list[RowSpec], sampling: SamplingParams,
                        should_abort: Callable[[], bool], where: list[int], outputs: list[RowOutput | None],
                        started: list[int | None]) -> None:
        """Deterministic mode: each prompt's rows alone, in order; rows of groups not started when
        `should_abort` turns true come back empty (`abort`)."""
        with self._alone_lock:
            for members in split_groups([r.request_id for r in reqs]):
                if should_abort():
                    for k in members:
                        outputs[where[k]] = RowOutput(finish_reason="abort")
                    continue
                t0 = time.perf_counter()
                with self._model_lock, torch.inference_mode():
                    version = self.version
                    outs = generate_alone(self._forward, [specs[k] for k in members],
                                          [reqs[k].request_id for k in members],
                                          [len(reqs[k].prefix_ids) for k in members], sampling,
                                          eos_ids=self.eos_ids, pad_id=self.pad_token_id, device=self.device)
                self._alone_seconds += time.perf_counter() - t0
                self._counters.prefill_tokens += sum(len(specs[k].context) for k in members)
                for k, out in zip(members, outs):
                    outputs[where[k]], started[where[k]] = out, version

    def set_threads(self, n: int) -> None:
        """Decode with `n` intra-op threads from the next decode step on (`torch.set_num_threads` in the decode
        thread; elastic cores)."""
        self._batcher.threads = max(1, int(n))

    def take_thread_stats(self) -> dict[str, float]:
        """The threads of the last decode step and their mean over the steps since the last call."""
        return self._batcher.take_thread_stats()

    def capacity(self) -> int:
        """Rows a new request could take now (`max_batch_size` − running − waiting)."""
        return self._batcher.free_rows()

    def _check(self, req: GenRequest) -> None:
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        if len(req.prefix_log_probs) != len(req.prefix_ids):
            raise ValueError(
                f"request {req.request_id!r}: {len(req.prefix_ids)} prefix tokens but "
                f"{len(req.prefix_log_probs)} prefix log-probs"
            )
        if self.vision is None:
            if req.images:
                raise ValueError(f"request {req.request_id!r} has {len(req.images)} image(s) but the model is "
                                 "text-only")
            return
        counts = [self.image_encoder.tokens(img) for img in req.images]
        try:
            check_image_tokens(req.prompt_ids + req.prefix_ids, self.vision.image_token_id, counts,
                               f"request {req.request_id!r}")
        except PlaceholderMismatch:
            self._stats["image_mismatch"] += 1
            raise
        self._stats["images"] += len(req.images)

    @property
    def image_encoder(self) -> ImageEncoder:
        """The encoder of the model's image processor (from the model directory on first use)."""
        if self._encoder is None:
            model_dir = model_dir_of(self.model)
            if model_dir is None:
                raise ValueError("a vision-language model needs `image_encoder` when it was not loaded from a "
                                 "local directory")
            self._encoder = ImageEncoder.for_model_dir(model_dir)
        assert isinstance(self._forward, MultimodalForward)
        self._forward.encoder = self._encoder
        return self._encoder

    def _generator(self, seed: int | None) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else random.SystemRandom().getrandbits(63))
        return generator

    def _result(self, req: GenRequest, out: RowOutput | None, started: int | None) -> GenResult:
        assert out is not None
        resumed = bool(req.prefix_ids) and req.min_version is not None
        first = self.version if started is None else started
        return GenResult(
            request_id=req.request_id,
            response_ids=list(req.prefix_ids) + out.tokens,
            log_probs=list(req.prefix_log_probs) + out.log_probs,
            finish_reason=out.finish_reason,
            min_version=int(req.min_version) if resumed else first,
            max_version=self.version,
            new_tokens=len(out.tokens),
        )

    def _account(self, results: list[GenResult], seconds: float) -> None:
        with self._stats_lock:  # gen_seconds is replaced by the batcher's busy time in `stats()`
            account_results(self._stats, results, seconds)
            self._stats["call_seconds"] = self._stats.get("call_seconds", 0.0) + seconds

    # --- weights ----------------------------------------------------------------------------------------
    def update_weights(self, buckets: Iterable[dict[str, np.ndarray]], version: int) -> None:
        """Copy HF-named arrays into the parameters in place (tied `lm_head.weight` writes the shared
        embedding) and set `version`."""
        start = time.perf_counter()
        with self._model_lock:
            if self._back is not None:  # the live weights are written in place: no sum taken at a stage holds
                self._back.forget_samples()
            copied = load_buckets_into(self.model, buckets)
            self.version = int(version)
        self._stats["weight_updates"] += 1
        self._stats["weight_update_seconds"] += time.perf_counter() - start
        self._stats["weight_update_bytes"] += copied

    def stage_weights(self, buckets: Iterable[Any], version: int) -> None:
        """Receive `version` into the back buffer (`engine.sync.staging`) while generation goes on with the
        live weights; `swap_weights(version)` makes it live. The first call allocates the back buffer (as large
        as the weights)."""
        start = time.perf_counter()
        with self._stage_lock:
            if self._back is None:
                self._back = BackBuffer(self.model)
            self._back.allocate(self._model_lock)
            copied = self._back.stage(buckets, version)
        self._stats["weight_update_bytes"] += copied
        self._stats["weight_stage_seconds"] = self._stats.get("weight_stage_seconds", 0.0) + \
            time.perf_counter() - start

    def swap_weights(self, version: int) -> None:
        """Make the staged `version` live between two decode steps: each parameter's storage swapped with its
        back buffer (no copy); rows started from here on run on it."""
        start = time.perf_counter()
        with self._stage_lock, self._model_lock:
            if self._back is None:
                raise RuntimeError(f"weight sync v{version}: nothing staged to swap in")
            self._back.swap(version)
            self.version = int(version)
        self._stats["weight_updates"] += 1
        self._stats["weight_update_seconds"] += time.perf_counter() - start

    def back_buffer_bytes(self) -> int:
        """Bytes a back buffer takes (the weights'), allocated or not."""
        return weights_nbytes(self.model)

    def allocate_back_buffer(self) -> None:
        """Allocate (and touch) the back buffer now rather than at the first `stage_weights`."""
        with self._stage_lock:
            if self._back is None:
                self._back = BackBuffer(self.model)
            self._back.allocate(self._model_lock)

    def weights_fingerprint(self) -> int:
        """A sample fingerprint of the loaded weights (`engine.sync.verify.weights_fingerprint`)."""
        with self._model_lock:  # right after a swap: the sums the stage took of what it made live
            known = self._back.take_samples() if self._back is not None else None
            return weights_fingerprint(self.model.state_dict().values(), known)

    # --- telemetry --------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Counters since start, plus `tokens_per_s` (generated tokens / generation seconds: the time the
        running batch was busy, however many calls shared it; `call_seconds` sums the calls' own wall time),
        `prefill_tokens` (distinct context tokens prefilled), `decode_row_steps`, `capacity` and `version`."""
        with self._stats_lock:
            out: dict[str, Any] = dict(self._stats)
        out.setdefault("call_seconds", 0.0)
        out["gen_seconds"] = self._batcher.busy_seconds + self._alone_seconds
        out["capacity"] = float(self.capacity())
        out["prefill_tokens"] = float(self._counters.prefill_tokens)
        out["decode_steps"] = float(self._counters.decode_steps)
        out["decode_row_steps"] = float(self._counters.row_steps)
        out["tokens_per_s"] = out["tokens_generated"] / out["gen_seconds"] if out["gen_seconds"] > 0 else 0.0
        out["version"] = float(self.version)
        return out
