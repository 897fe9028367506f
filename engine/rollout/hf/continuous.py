"""Continuous batching for the `hf` sampler: one running batch that requests join and leave at every decode
step, fed by any number of concurrent `generate` calls.

One worker thread owns the batch (started on demand, gone when idle). Each iteration — a token boundary —
does, in order:

1. **abort check**: each call's `should_abort` is polled once (twice in the iteration a call is first
   admitted: before its prefill and before its first token, as a one-batch decode would). A call whose
   poll is True ends at once: running rows keep their tokens (`finish_reason="abort"`), rows not yet admitted
   come back empty.
2. **admission** while rows are free (`max_rows`): pending rows in arrival order, the rows of a call sorted
   so that identical contexts (the `n` samples of a prompt) sit together. Distinct contexts are prefilled
   once (left-padded, RoPE positions p = cumsum(mask) − 1) and their cache rows repeated — also across
   steps: a context whose rows join in several steps keeps its one-row prefill until its last row joined
   (dropped if the weights changed meanwhile). The new rows join the running ones in free row slots or by
   one rebuild (`kv_cache.merge_rows`: every row right-aligned, masks left-padded, padding zeroed).
3. **sampling**: one token per live row from its pending logits, under its own call's `SamplingParams`
   and seeded generator, so a call's draws do not depend on which other calls share the batch.
4. **retirement**: rows that sampled EOS ("stop") or spent their budget ("length") leave the batch and the
   cache; a call returns when its last row is done.
5. **decode step** for the rows left: one forward of the sampled tokens at positions L_i + t (+ δ_i, the
   multimodal RoPE offset), giving the next pending logits.

Threads: `threads` (set by `HFRolloutBackend.set_threads`, elastic cores) is applied with `torch.set_num_threads`
in the worker thread at the start of an iteration — a decode-step boundary — when it differs from what that
thread runs with (torch's thread count is per thread once a thread has computed).

A row's log-probs are those of its own context whatever padding or neighbours the batch gives it (the
attention mask hides padding; rows never attend to each other), so abort/resume at any boundary and the
trainer's recomputation agree as before. Models whose cache cannot be merged (sliding-window layers:
`kv_cache.supports_merge`) admit new rows only into an empty batch.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.decode import DecodeCounters, ForwardAdapter, RowOutput, RowSpec, left_pad
from engine.rollout.hf.kv_cache import make_cache, merge_rows, supports_merge
from engine.rollout.hf.sampling import select_tokens

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass
class BatchCall:
    """One `generate` call's rows (already validated; each has budget > 0)."""

    rows: list[RowSpec]
    sampling: SamplingParams
    should_abort: Callable[[], bool]
    generator: torch.Generator
    outputs: list[RowOutput] = field(default_factory=list)
    start_versions: list[int | None] = field(default_factory=list)
    remaining: int = 0
    polled: bool = False
    aborted: bool = False
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.keys = [(tuple(r.context), tuple(r.images)) for r in self.rows]
        self.outputs = [RowOutput() for _ in self.rows]
        self.start_versions = [None] * len(self.rows)
        self.remaining = len(self.rows)


@dataclass
class _Live:
    call: BatchCall
    index: int

    @property
    def out(self) -> RowOutput:
        return self.call.outputs[self.index]


class ContinuousBatcher:
    """The running batch of one `HFRolloutBackend` (see the module docstring)."""

    def __init__(self, forward: ForwardAdapter, *, eos_ids: torch.Tensor, pad_id: int, device: torch.device,
                 max_rows: int, counters: DecodeCounters, model_lock: threading.RLock,
                 version: Callable[[], int]) -> None:
        self.forward, self.pad_id, self.device, self.max_rows = forward, pad_id, device, max_rows
        self.eos = set(int(e) for e in eos_ids.tolist())
        self.counters, self.model_lock, self.version = counters, model_lock, version
        self._lock = threading.Lock()  # guards _pending, _calls and _worker
        self._pending: list[tuple[BatchCall, int]] = []
        self._calls: list[BatchCall] = []
        self._worker: threading.Thread | None = None
        self._completed: list[BatchCall] = []  # signalled once the iteration left the batch consistent
        self._waiting_keys: Counter = Counter()  # context key → rows of it still waiting
        self._stash: dict[Any, tuple[int, Any, torch.Tensor, torch.Tensor]] = {}
        self.busy_seconds = 0.0
        self.threads: int | None = None  # wanted intra-op threads (None: the process's setting)
        self._thread_sum = 0  # threads × iterations since `take_thread_stats`
        self._thread_steps = 0
        self._thread_last = 0
        self._reset()

    def _reset(self) -> None:
        self.live: list[_Live] = []
        self.cache: Any = None
        self.mask = self.logits = self.next_pos = self.offsets = self.tokens = None

    # --- the callers' side ------------------------------------------------------------------------------
    def run(self, call: BatchCall) -> None:
        """Add `call`'s rows to the batch and block until every one of them is finished or aborted."""
        if not call.rows:
            return
        order = sorted(range(len(call.rows)), key=lambda i: (len(call.rows[i].context), call.rows[i].context,
                                                             call.rows[i].images))
        with self._lock:
            self._calls.append(call)
            self._pending.extend((call, i) for i in order)
            self._waiting_keys.update(call.keys)
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name="hf-continuous-batch", daemon=True)
                self._worker.start()
        call.done.wait()
        if call.error is not None:
            raise call.error

    def free_rows(self) -> int:
        """Rows a new request could take now: max_rows − running − waiting (≥ 0)."""
        with self._lock:
            return max(0, self.max_rows - len(self.live) - len(self._pending))

    # --- the worker -------------------------------------------------------------------------------------
    def take_thread_stats(self) -> dict[str, float]:
        """`{"applied", "mean"}`: the threads of the last iteration, their mean over the iterations since the
        last call (the last one's when none ran)."""
        with self._lock:
            last = self._thread_last or torch.get_num_threads()
            mean = self._thread_sum / self._thread_steps if self._thread_steps else last
            self._thread_sum = self._thread_steps = 0
            return {"applied": float(last), "mean": float(mean)}

    def _apply_threads(self) -> None:
        """At a decode-step boundary, in the worker thread: take the wanted thread count."""
        want = self.threads
        if want is not None and want != torch.get_num_threads():
            torch.set_num_threads(want)
        n = torch.get_num_threads()
        with self._lock:
            self._thread_last = n
            self._thread_sum += n
            self._thread_steps += 1

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._pending and not self.live:
                    self._worker = None
                    return
            self._apply_threads()
            start = time.perf_counter()
            try:
                with self.model_lock, torch.inference_mode():
                    self._iteration()
            except BaseException as e:  # noqa: BLE001 - handed to every waiting caller
                self._fail_all(e)
            finally:
                self.busy_seconds += time.perf_counter() - start
                completed, self._completed = self._completed, []
                for call in completed:
                    call.done.set()

    def _iteration(self) -> None:
        with self._lock:
            calls = list(self._calls)
        for call in calls:  # a new call's first poll: before its prefill
            if not call.polled:
                call.polled = True
                if call.should_abort():
                    self._abort_call(call)
        self._admit()
        for call in calls:  # every call, once per boundary: before its rows' next token
            if not call.aborted and call.remaining > 0 and call.should_abort():
                self._abort_call(call)
        if not self.live:
            return
        self._sample_and_retire()
        if self.live:
            self._decode_step()

    def _admit(self) -> int:
        """Admit waiting rows into the free rows. Each distinct context is prefilled once: when only some of
        its rows fit now, its one-row prefill (KV and next-token logits) is kept — for the weights version
        it was computed with — for the rest, so the `n` samples of a prompt share one prefill even when
        they join at different steps."""
        with self._lock:
            if self.live and not supports_merge(self.cache):
                return 0
            free = self.max_rows - len(self.live)
            take = [(c, i) for c, i in self._pending[:free] if not c.aborted]
            self._pending = self._pending[free:]
            self._waiting_keys.subtract(call.keys[i] for call, i in take)
        if not take:
            return 0
        version = self.version()
        keys = [call.keys[i] for call, i in take]
        config = getattr(self.forward.model, "config", None)
        if not supports_merge(make_cache(config, 1)):
            return self._admit_unmerged(take, keys, config, version)
        fresh = [k for k in dict.fromkeys(keys) if self._stash.get(k, (None,))[0] != version]
        parts: list[tuple[Any, list[int]]] = []
        masks, logit_rows, offset_rows, order = [], [], [], []
        if fresh:
            ids, pmask = left_pad([list(k[0]) for k in fresh], self.pad_id, self.device)
            pcache = make_cache(config, ids.shape[1])
            plogits, poffsets = self.forward.prefill(ids, pmask, pcache, [k[1] for k in fresh])
            self.counters.prefill_tokens += int(pmask.sum())
            where = {k: u for u, k in enumerate(fresh)}
            mine = [j for j, k in enumerate(keys) if k in where]
            idx = [where[keys[j]] for j in mine]
            parts.append((pcache, idx))
            order += mine
            masks.append(pmask[idx])
            logit_rows.append(plogits[idx])
            offset_rows.append(poffsets[idx])
            with self._lock:
                later = [k for k in fresh if self._waiting_keys[k] > 0]
            for k in later:
                u = where[k]
                one = torch.tensor([u], dtype=torch.long, device=self.device)
                self._stash[k] = (version, merge_rows([(pcache, one)], len(k[0]), len(k[0])),
                                  plogits[one], poffsets[one])
        for k in dict.fromkeys(keys):
            if k in self._stash and k not in fresh:
                _, scache, slogits, soffset = self._stash[k]
                mine = [j for j, kk in enumerate(keys) if kk == k]
                parts.append((scache, [0] * len(mine)))
                order += mine
                masks.append(torch.ones((len(mine), len(k[0])), dtype=torch.long, device=self.device))
                logit_rows.append(slogits.expand(len(mine), -1))
                offset_rows.append(soffset.expand(len(mine)))
        self._drop_stale_stash()
        take = [take[j] for j in order]
        rows = [call.rows[i] for call, i in take]
        width = max(m.shape[1] for m in masks)
        budget = max(r.budget for r in rows)
        cache = merge_rows([(c, torch.tensor(ix, dtype=torch.long, device=self.device)) for c, ix in parts],
                           width, width + (0 if self.live else budget + 1))
        mask = torch.cat([_left_pad_mask(m, width) for m in masks])
        logits, offsets = torch.cat(logit_rows), torch.cat(offset_rows)
        next_pos = torch.tensor([len(r.context) for r in rows], dtype=torch.long, device=self.device)
        room = max(self._remaining_budget(), budget)
        new = [_Live(call, i) for call, i in take]
        for row in new:
            row.call.start_versions[row.index] = version
        if not self.live:
            self.cache, self.mask, self.logits, self.next_pos, self.offsets = cache, mask, logits, next_pos, offsets
        else:
            with self._lock:
                waiting = len(self._pending)
            self._merge(cache, mask, logits, next_pos, offsets, room, waiting)
        self.live.extend(new)
        return len(new)

    def _admit_unmerged(self, take: list[tuple[BatchCall, int]], keys: list[Any], config: PretrainedConfig,
                        version: int) -> int:
        """Models on transformers' own cache (sliding windows): rows join only an empty batch, one prefill
        per distinct context of this admission."""
        unique = list(dict.fromkeys(keys))
        rows = [call.rows[i] for call, i in take]
        ids, mask = left_pad([list(k[0]) for k in unique], self.pad_id, self.device)
        cache = make_cache(config, ids.shape[1] + max(r.budget for r in rows))
        logits, offsets = self.forward.prefill(ids, mask, cache, [k[1] for k in unique])
        self.counters.prefill_tokens += int(mask.sum())
        expand = torch.tensor([unique.index(k) for k in keys], dtype=torch.long, device=self.device)
        if len(unique) < len(rows):
            cache.select_rows(expand)
        self.cache, self.mask, self.logits, self.offsets = cache, mask[expand], logits[expand], offsets[expand]
        self.next_pos = torch.tensor([len(r.context) for r in rows], dtype=torch.long, device=self.device)
        self.live = [_Live(call, i) for call, i in take]
        for row in self.live:
            row.call.start_versions[row.index] = version
        return len(take)

    def _drop_stale_stash(self) -> None:
        """Forget kept prefills whose rows are no longer waiting."""
        with self._lock:
            gone = [k for k in self._stash if self._waiting_keys[k] <= 0]
            for k in gone:
                del self._stash[k]
            self._waiting_keys = +self._waiting_keys

    def _remaining_budget(self) -> int:
        return max((r.call.rows[r.index].budget - len(r.out.tokens) for r in self.live), default=0)

    def _merge(self, cache: Any, mask: torch.Tensor, logits: torch.Tensor, next_pos: torch.Tensor,
               offsets: torch.Tensor, room: int, waiting: int) -> None:
        """Join the prefilled rows to the running batch. In place when they fit the free row slots and are
        no wider than the batch (one copy of the new rows); else one rebuild of the whole cache, trimmed to
        the widest real row and with row slots for the rows still `waiting` (up to `max_rows`)."""
        if self.cache.can_append(cache):
            self.cache.append_rows(cache)
            self.mask = torch.cat([self.mask, _left_pad_mask(mask, self.mask.shape[1])])
        else:
            width = max(int(self.mask.sum(dim=1).max()), mask.shape[1])
            rows = len(self.live) + mask.shape[0]
            self.cache = merge_rows([(self.cache, None), (cache, None)], width, width + room + 1,
                                    row_capacity=min(self.max_rows, rows + waiting))
            old = self.mask[:, max(0, self.mask.shape[1] - width):]
            self.mask = torch.cat([_left_pad_mask(old, width), _left_pad_mask(mask, width)])
        self.logits = torch.cat([self.logits, logits])
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.offsets = torch.cat([self.offsets, offsets])

    def _sample_and_retire(self) -> None:
        """One token per live row (each call's rows under its own sampling and generator); retire the rows
        that finished; leave `self.tokens` = the sampled tokens of the rows still running."""
        groups: dict[int, list[int]] = {}
        for j, row in enumerate(self.live):
            groups.setdefault(id(row.call), []).append(j)
        if len(groups) == 1:
            call = self.live[0].call
            tokens, log_probs = select_tokens(self.logits, call.sampling, call.generator)
        else:
            tokens = torch.empty(len(self.live), dtype=torch.long, device=self.device)
            log_probs = torch.empty(len(self.live), dtype=torch.float32, device=self.device)
            for members in groups.values():
                call = self.live[members[0]].call
                idx = torch.tensor(members, dtype=torch.long, device=self.device)
                tokens[idx], log_probs[idx] = select_tokens(self.logits[idx], call.sampling, call.generator)
        token_list, lp_list = tokens.tolist(), log_probs.tolist()
        self.counters.row_steps += len(self.live)
        keep: list[int] = []
        for j, row in enumerate(self.live):
            out = row.out
            out.tokens.append(token_list[j])
            out.log_probs.append(lp_list[j])
            if token_list[j] in self.eos:
                self._finish(row, "stop")
            elif len(out.tokens) >= row.call.rows[row.index].budget:
                self._finish(row, "length")
            else:
                keep.append(j)
        self.tokens = tokens
        if len(keep) < len(self.live):
            self._keep(keep)

    def _keep(self, keep: Sequence[int]) -> None:
        """Drop every live row not in `keep` (ascending) from the batch. The preallocated cache does it in
        place: each hole below len(keep) takes one surviving row from above it (one row's copy each, not
        the whole cache); the row order of the small tensors and of `live` follows."""
        before = len(self.live)
        if not keep:
            self._reset()
            return
        n = len(keep)
        if supports_merge(self.cache):
            kept = set(keep)
            holes = [i for i in range(n) if i not in kept]
            movers = [j for j in keep if j >= n]
            order = list(range(n))
            for h, m in zip(holes, movers):
                order[h] = m
            self.cache.move_rows(torch.tensor(movers, dtype=torch.long, device=self.device),
                                 torch.tensor(holes, dtype=torch.long, device=self.device), n)
        else:
            order = list(keep)
            self.cache.select_rows(torch.tensor(order, dtype=torch.long, device=self.device))
        idx = torch.tensor(order, dtype=torch.long, device=self.device)
        self.live = [self.live[j] for j in order]
        self.mask, self.logits = self.mask[idx], self.logits[idx]
        self.next_pos, self.offsets = self.next_pos[idx], self.offsets[idx]
        if self.tokens is not None and self.tokens.shape[0] == before:
            self.tokens = self.tokens[idx]

    def _decode_step(self) -> None:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        self.logits = self.forward.step(self.tokens, self.mask, self.next_pos + self.offsets, self.cache)
        self.next_pos = self.next_pos + 1
        self.counters.decode_steps += 1

    # --- endings ----------------------------------------------------------------------------------------
    def _finish(self, row: _Live, reason: str) -> None:
        row.out.finish_reason = reason  # type: ignore[assignment]
        self._row_done(row.call)

    def _row_done(self, call: BatchCall, count: int = 1) -> None:
        call.remaining -= count
        if call.remaining <= 0:
            with self._lock:
                if call in self._calls:
                    self._calls.remove(call)
            self._completed.append(call)

    def _abort_call(self, call: BatchCall) -> None:
        """End `call` now: its running rows keep their tokens, its waiting rows come back empty."""
        call.aborted = True
        with self._lock:
            waiting = [(c, i) for c, i in self._pending if c is call]
            self._pending = [(c, i) for c, i in self._pending if c is not call]
            self._waiting_keys.subtract(call.keys[i] for _, i in waiting)
        self._drop_stale_stash()
        running = [j for j, r in enumerate(self.live) if r.call is call]
        if running:
            self._keep([j for j in range(len(self.live)) if self.live[j].call is not call])
        self._row_done(call, len(waiting) + len(running))

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            calls, self._calls, self._pending = list(self._calls), [], []
            self._waiting_keys, self._stash = Counter(), {}
        self._reset()
        for call in calls:
            call.error = error
            self._completed.append(call)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    if mask.shape[1] == width:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], width - mask.shape[1])), mask], dim=1)
