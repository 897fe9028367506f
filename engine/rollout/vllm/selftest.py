"""Resume-continuity self-test of the vLLM backend (mixed into `VLLMRolloutBackend`).

Partial rollout is only correct if an interruption loses no token: a known vLLM bug class drops (or
repeats) the first token generated after a resume, e.g. when a preempted request's stale output is
discarded. The test compares, greedily and with EOS ignored, an uninterrupted generation with

- the abort path: `pause("abort")` after k tokens, `resume`, continue from the partial prefix;
- the keep path: `pause("keep")` after k tokens, the request preempted (its KV cache dropped, exactly as
  `update_weights` does), `resume`.

Both must reproduce the uninterrupted tokens exactly, and their log-probs within a tolerance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from engine.rollout.base import SamplingParams
from engine.types import GenRequest

GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class ResumeContinuityReport:
    """`ok` iff both interrupted sequences equal the uninterrupted one token for token and their
    log-probs agree within `tolerance`."""

    ok: bool
    reference: list[int]
    resumed_after_abort: list[int]  # partial tokens + continuation submitted with them as prefix
    continued_after_keep: list[int]  # one request frozen, preempted and resumed
    aborted_after: int
    kept_after: int
    first_mismatch: int | None
    max_log_prob_diff: float
    tolerance: float


def first_mismatch(reference: list[int], tokens: list[int]) -> int | None:
    """First index where the sequences differ (the shorter length if one is a strict prefix)."""
    index = next((i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b), None)
    if index is None and len(reference) != len(tokens):
        index = min(len(reference), len(tokens))
    return index


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=False)), default=0.0)


def _never() -> bool:
    return False


class ResumeContinuitySelfTest:
    """Needs from the host class: `version`, `_engine` (AsyncLLM), `_flights` (engine id → flight with
    `.request` / `.tokens` / `.log_probs`), `_run(coro)`, `_generate(requests, sampling, should_abort,
    ignore_eos=...)` returning the flights, `_pause(mode)` / `_resume()` and `features` (`compat`)."""

    version: int
    _engine: Any
    _flights: dict[str, Any]
    _run: Callable[[Coroutine[Any, Any, Any]], Any]
    _generate: Callable[..., Coroutine[Any, Any, list[Any]]]
    _pause: Callable[[str], Coroutine[Any, Any, None]]
    _resume: Callable[[], Coroutine[Any, Any, None]]
    features: Any  # compat.EngineFeatures

    def self_test_resume_continuity(
        self,
        prompt_ids: list[int] | None = None,
        n_tokens: int = 64,
        interrupt_after: int = 8,
        tolerance: float = 1e-3,
    ) -> ResumeContinuityReport:
        """Run the self-test on the current weights (see the module docstring). Run it on an idle engine:
        the pauses affect every in-flight request."""
        prompt = list(prompt_ids) if prompt_ids else [1, 2, 3, 4, 5, 6, 7, 8]

        def request(name: str) -> GenRequest:
            return GenRequest(f"selftest-{name}", prompt, max_new_tokens=n_tokens)

        (ref,) = self._run(self._generate([request("reference")], GREEDY, _never, ignore_eos=True))
        cut, cut_at = self._run(self._interrupted(request("abort"), interrupt_after, "abort"))
        rest = GenRequest(
            "selftest-resume",
            prompt,
            prefix_ids=cut.tokens,
            prefix_log_probs=cut.log_probs,
            max_new_tokens=n_tokens - len(cut.tokens),
            min_version=self.version,
        )
        (tail,) = self._run(self._generate([rest], GREEDY, _never, ignore_eos=True))
        kept, kept_at = self._run(self._interrupted(request("keep"), interrupt_after, "keep"))
        candidates = [
            (cut.tokens + tail.tokens, cut.log_probs + tail.log_probs),
            (kept.tokens, kept.log_probs),
        ]
        mismatches = [first_mismatch(ref.tokens, tokens) for tokens, _ in candidates]
        first = min((m for m in mismatches if m is not None), default=None)
        diff = max(max_abs_diff(ref.log_probs, log_probs) for _, log_probs in candidates)
        return ResumeContinuityReport(
            ok=first is None and diff <= tolerance,
            reference=ref.tokens,
            resumed_after_abort=candidates[0][0],
            continued_after_keep=candidates[1][0],
            aborted_after=cut_at,
            kept_after=kept_at,
            first_mismatch=first,
            max_log_prob_diff=diff,
            tolerance=tolerance,
        )

    async def _interrupted(
        self, request: GenRequest, after: int, mode: Literal["keep", "abort"]
    ) -> tuple[Any, int]:
        """Run `request` greedily (EOS ignored), pause the engine in `mode` once it has `after` tokens
        (in "keep" mode also preempt it) and resume. Returns the flight and its token count at the pause."""
        task = asyncio.create_task(self._generate([request], GREEDY, _never, ignore_eos=True))
        at = 0
        try:
            while not task.done():
                flight = next((f for f in list(self._flights.values()) if f.request is request), None)
                if flight is not None and len(flight.tokens) >= after:
                    await self._pause(mode)
                    at = len(flight.tokens)
                    if mode == "keep":
                        await self.features.reset_prefix_cache(self._engine)
                    break
                await asyncio.sleep(0.001)
        finally:
            await self._resume()
        (flight,) = await task
        return flight, at
