"""The seam where rollout engines plug in (`hf` — the embedded default — and `vllm`).

A backend lives inside one rollout replica (a threaded Ray actor, see `engine.runtime.replica`). `generate`
is synchronous and thread-safe: the replica may call it from several threads at once, and both backends
batch continuously — requests of a new call join the running batch at the next decode step, each call
returns when its own requests are finished or aborted, and `capacity()` tells how many more sequences would
fit now. The abort flag is flipped from yet another thread.

Partial rollout follows verl's mechanism: at a weight sync the replica aborts in-flight sequences, which
come back with `finish_reason="abort"` and the tokens generated so far; the rollouter resubmits them as
`GenRequest(prefix_ids=..., max_new_tokens=remaining)` under the new weights. Any backend that can stop at a
token boundary and continue from a prefix (HF, vLLM) therefore supports partial rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import numpy as np

# `SamplingParams` lives with the loop's data (`engine.types`: a role spec carries it, without numpy); the
# backends import it from here
from engine.types import FinishReason, GenRequest, GenResult, SamplingParams


ROLLOUT_STATS = ("calls", "requests", "tokens_generated", "gen_seconds", "finished_stop", "finished_length",
                 "aborted", "weight_updates", "weight_update_seconds", "weight_update_bytes", "images")
"""The counters every backend's `stats()` reports (backends may add their own)."""


def new_rollout_stats(*extra: str) -> dict[str, float]:
    """Zeroed counters: `ROLLOUT_STATS` plus a backend's `extra` names."""
    return {name: 0.0 for name in (*ROLLOUT_STATS, *extra)}


FINISH_COUNTERS: dict[FinishReason, str] = {
    "stop": "finished_stop", "length": "finished_length", "abort": "aborted"
}
"""The `ROLLOUT_STATS` counter of each `finish_reason`."""


def account_results(stats: dict[str, float], results: list[GenResult], seconds: float) -> None:
    """Count one `generate` call into `stats`: calls += 1, requests += len(results), tokens_generated += the new
    tokens, gen_seconds += `seconds`, and each result into its finish counter (`FINISH_COUNTERS`)."""
    stats["calls"] += 1
    stats["requests"] += len(results)
    stats["tokens_generated"] += sum(r.new_tokens for r in results)
    stats["gen_seconds"] += seconds
    for r in results:
        stats[FINISH_COUNTERS[r.finish_reason]] += 1


@runtime_checkable
class RolloutBackend(Protocol):
    """A generation engine for one replica."""

    version: int
    """The weight version currently loaded (0 = initial weights)."""

    def generate(
        self,
        requests: list[GenRequest],
        sampling: SamplingParams,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> list[GenResult]:
        """Generate every request to EOS or its budget. `should_abort` is polled at every token boundary;
        when it returns True the unfinished requests are returned with `finish_reason="abort"` and their
        partial tokens. Results are in the order of `requests`. May run concurrently with other calls
        (their requests share the running batch)."""
        ...

    def capacity(self) -> int:
        """Sequences a new request could take now (`rollout.max_num_seqs` − running − waiting, ≥ 0)."""
        ...

    def update_weights(self, buckets: Iterable[dict[str, np.ndarray]], version: int) -> None:
        """Load HF-named weights in place (tied `lm_head.weight` included) and set `version`. `buckets` yields
        `engine.sync.flat.FlatBucket`s (or dicts of tensors / arrays); a vLLM backend handed an
        `engine.sync.verify.Delivery` with a collective `handle` lets its workers receive it and sets the
        delivery's `fingerprints` from theirs."""
        ...

    def weights_fingerprint(self) -> int:
        """A sample fingerprint of the loaded weights (`engine.sync.verify.weights_fingerprint`), compared
        across syncs by the trainer's delivery check."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since start: `tokens_generated`, `gen_seconds`, ..."""
        ...
