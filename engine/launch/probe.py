"""The launch-time measurement behind `"auto"` precision, threads and attention (`engine.plan.auto` decides).

`resolve_auto(plan, model_dir)` is what the driver calls before anything starts: when the config has an
"auto" setting it times the run's matmul shapes on this machine (fp32 vs bf16 on one thread, then every core
in each role's chosen precision, then the trainer's attention fwd + bwd in sdpa vs eager on the trainer's
chosen threads), decides, prints one line per setting on stderr, and returns the plan of the resolved config
(concrete values, so the actors, `config.resolved.json` and a resume see what ran) and the record for
`<run dir>/machine.json`. On cuda / npu nothing is timed (bf16, sdpa).

Each timing is the fastest of a few calls after one warm-up (the minimum is the estimate least disturbed by
other processes on the cores), at most ~`BUDGET_S` per entry. Timings are cached in
`<cache>/machine/<key>.json` (`$ASYNCRL_CACHE`, default `~/.cache/asyncrl`), the key hashing the CPU model,
its ISA flags, the cores, torch's version and the shapes: a second launch of the same run on the same machine
measures nothing — unless other processes used `auto.QUIET_CORES` or more of the cores while it measured (the
busy CPU time of the whole machine, from /proc/stat, less this process's own): a busy machine's times decide that
launch only, and the next launch measures again. Delete the file to measure again.

The precision ratio (bf16 ÷ fp32) is timed on one thread, so a process busy on another core does not move it
much (timed with every core beside one busy core, one launch read bf16 0.16× fp32 at a decode step where a
quiet one reads 2.7×: a kernel's threads wait for the descheduled one). Thread scaling needs every core free:
it is timed next, and when other processes used `auto.QUIET_CORES` or more meanwhile, the role keeps the split.
The attention is timed last, on the threads the trainer will run (the ratio depends on them: at the demo's
shared-prompt shape on an AMD EPYC, sdpa time ÷ eager time read 0.58× on one thread and 1.95–1.98× on two, and a
whole update on two threads was 1.08× faster with eager — study 16).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.persist.atomic import atomic_write_json
from engine.plan import auto
from engine.plan.machine import cpu_identity
from engine.plan.run_plan import RunPlan, resolve_plan

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

BUDGET_S = 0.15
"""Time spent timing one entry (after its warm-up), at most MAX_CALLS calls and at least MIN_CALLS."""
MIN_CALLS, MAX_CALLS = 2, 20
ATTN_MIN_CALLS = 5
"""An attention fwd + bwd takes tens of ms, so the budget alone would time it twice: sdpa and eager are often
within 10–20 % of each other, and the fastest of two calls moved their ratio from 0.6× to 1.2× between launches."""


def _busy_cpu_seconds() -> float | None:
    """CPU seconds every process on this machine has used since boot (/proc/stat: all but idle and iowait),
    None where it cannot be read."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CoresElsewhere:
    """`with CoresElsewhere() as other:` … `other.cores` = the cores other processes used during the block:
    (machine busy CPU s − this process's CPU s) ÷ wall s, ≥ 0. Where /proc/stat cannot be read, the 1-minute
    load average at the start stands in for it."""

    def __enter__(self) -> CoresElsewhere:
        self.cores = 0.0
        self._t, self._busy, self._own = time.monotonic(), _busy_cpu_seconds(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy = time.monotonic() - self._t, _busy_cpu_seconds()
        if self._busy is None or busy is None:
            self.cores = os.getloadavg()[0]
        elif wall > 0:
            self.cores = max(0.0, (busy - self._busy - (time.process_time() - self._own)) / wall)


def _best_time(call: Callable[[], Any], threads: int, min_calls: int = MIN_CALLS) -> float:
    """The fastest of a few calls of `call` after one warm-up, with `threads` intra-op threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        call()  # warm-up: the kernel's first call packs / allocates
        best, calls, start = float("inf"), 0, time.perf_counter()
        while calls < min_calls or (calls < MAX_CALLS and time.perf_counter() - start < BUDGET_S):
            t0 = time.perf_counter()
            call()
            best, calls = min(best, time.perf_counter() - t0), calls + 1
        return best
    finally:
        torch.set_num_threads(before)


def time_matmul(shape: tuple[int, ...], mode: str, threads: int, autocast: bool) -> float:
    """Seconds of one `F.linear` of `rows × in` by an `out × in` weight with `threads` intra-op threads.
    `mode` "bf16": bf16 autocast over fp32 tensors (`autocast`, the trainer) or bf16 tensors (the rollout)."""
    import torch
    import torch.nn.functional as F

    rows, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen) * 0.02
    if mode == "bf16" and not autocast:
        x, w = x.bfloat16(), w.bfloat16()

    def call() -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                    enabled=mode == "bf16" and autocast):
            F.linear(x, w)

    return _best_time(call, threads)


def time_attention(shape: tuple[int, ...], impl: str, precision: str, threads: int) -> float:
    """Seconds of one attention forward + backward of B rows × S positions (H query heads over K key-value heads
    of width d, `shape` = (B, S, H, K, d, n, r)) as transformers runs it: K/V repeated to H heads, then `impl`
    "sdpa" (`scaled_dot_product_attention` with the mask) or "eager" (softmax(QKᵀ/√d + mask) in fp32 · V, the
    additive mask in fp32: transformers builds it in the embeddings' dtype, fp32 under autocast);
    `precision` "bf16" = under bf16 autocast over fp32 leaves (the trainer's). The mask: causal (n = 0, a boolean
    one for sdpa), or, for a shared-prompt sequence of S − n·r prompt tokens and n responses of r, the additive
    fp32 mask the trainer passes (`engine.trainer.shared_prefix`)."""
    import torch
    import torch.nn.functional as F

    from engine.trainer.shared_prefix import additive_mask, group_allowed

    b, s, h, k, d, n, r = (*shape, 0, 0)[:7]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, s, d, generator=gen, requires_grad=True)
    kv = [torch.randn(b, k, s, d, generator=gen, requires_grad=True) for _ in range(2)]
    if n:
        allowed = group_allowed(s - n * r, [r] * n, s)
    else:
        allowed = torch.ones(s, s, dtype=torch.bool).tril()
    bias = additive_mask(allowed.expand(b, s, s), torch.float32)  # [B, 1, S, S], as the model's layers get it
    sdpa_mask = bias if n else allowed.expand(b, 1, s, s)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def call() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            qq, kk, vv = (x.to(dtype) for x in (q, *kv))
            kk, vv = (x.repeat_interleave(h // k, dim=1) for x in (kk, vv))
            if impl == "sdpa":
                out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=sdpa_mask)
            else:
                scores = torch.matmul(qq, kk.transpose(2, 3)) * d ** -0.5 + bias
                out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype), vv)
        out.float().sum().backward()

    return _best_time(call, threads, min_calls=ATTN_MIN_CALLS)


class Timings:
    """Cached matmul timings of one machine and shape set: `get(shape, mode, threads)` times on a miss."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], path: Path) -> None:
        self.shapes, self.path = shapes, path
        try:
            self.entries: dict[str, float] = json.loads(path.read_text())["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            self.entries = {}
        self.cached = bool(self.entries)
        self.dirty = False

    def get(self, shape: str, mode: str, threads: int) -> float:
        name = f"{shape}:{mode}:{threads}"
        if name not in self.entries:
            if shape == "attention":  # mode "<impl>-<precision>", e.g. "eager-bf16"
                impl, precision = mode.split("-")
                self.entries[name] = time_attention(self.shapes[shape], impl, precision, threads)
            else:
                autocast = shape in auto.ROLE_SHAPES["trainer"]
                self.entries[name] = time_matmul(self.shapes[shape], mode, threads, autocast)
            self.dirty, self.cached = True, False
        return self.entries[name]

    def save(self, meta: dict[str, Any]) -> None:
        """Write the cache (atomically); a cache that cannot be written is skipped."""
        if not self.dirty:
            return
        try:
            atomic_write_json(self.path, {**meta, "entries": self.entries})
        except OSError:
            pass


def measure(cfg: RunConfig, device: str, shapes: dict[str, tuple[int, ...]], weights: dict[str, float],
            timings: Timings, cores: int, split: dict[str, int]) -> tuple[dict[str, Any], list[auto.Choice]]:
    """Time what `cfg`'s "auto" settings need and decide them: (the times, the choices); `weights`:
    `auto.step_weights`, each shape's share of its role's step."""
    want = auto.wanted(cfg)
    measured: dict[str, Any] = {"precision": {}, "threads": {}, "attention": None}
    if want["trainer.precision"] or want["rollout.dtype"]:
        for role in auto.ROLES:
            for s in auto.ROLE_SHAPES[role]:
                measured["precision"][s] = {m: timings.get(s, m, 1) for m in ("fp32", "bf16")}
    choices = auto.decide_precision(cfg, device, measured["precision"], weights)
    for role in auto.ROLES:
        if want[f"resources.{role}.cpu_threads"]:
            mode = auto.resolved_precision(cfg, choices, role)
            one = auto.role_seconds({s: timings.get(s, mode, 1) for s in auto.ROLE_SHAPES[role]}, weights, role)
            known = len(timings.entries)
            with CoresElsewhere() as other:
                every = auto.role_seconds({s: timings.get(s, mode, cores) for s in auto.ROLE_SHAPES[role]}, weights,
                                          role)
            fresh = len(timings.entries) > known  # from the cache: it was quiet when it was measured
            measured["threads"][role] = {"1": one, "all": every, "elsewhere": round(other.cores, 2) if fresh else 0.0}
    choices += auto.decide_threads(cfg, device, measured["threads"], cores, split)
    if auto.measures_attention(cfg, device, shapes["attention"]):
        mode, threads = auto.resolved_precision(cfg, choices, "trainer"), auto.trainer_threads(cfg, choices, split)
        measured["attention"] = {impl: timings.get("attention", f"{impl}-{mode}", threads)
                                 for impl in ("sdpa", "eager")}
        measured["attention"]["threads"] = threads
    return measured, choices + auto.decide_attention(cfg, device, measured["attention"], shapes["attention"])


def resolve_auto(plan: RunPlan, model_dir: str, cache_dir: Path | None = None,
                 out: Any = None) -> tuple[RunPlan, dict[str, Any] | None]:
    """The plan with its "auto" settings decided on this machine (see the module docstring), and the record for
    `<run dir>/machine.json` (None when nothing was "auto"). Prints one line per setting on `out` (stderr)."""
    cfg = plan.config
    if not auto.has_auto(cfg):
        return plan, None
    out = out if out is not None else sys.stderr
    identity = cpu_identity()
    cores = int(identity["cores"])
    split = {"trainer": int(plan.actors["trainer_threads"]), "rollout": int(plan.actors["replica_threads"])}
    arch = json.loads((Path(model_dir) / "config.json").read_text())
    shapes = auto.probe_shapes(cfg, arch)
    weights = auto.step_weights(cfg, arch, shapes)
    measured: dict[str, Any] | None = None
    cached, busy = False, None
    if plan.device == "cpu":
        import torch

        from engine.models.cache import default_cache_dir

        key = auto.cache_key(identity, shapes, torch.__version__)
        timings = Timings(shapes, (cache_dir or default_cache_dir()) / "machine" / f"{key}.json")
        t0 = time.monotonic()
        with CoresElsewhere() as other:
            measured, choices = measure(cfg, plan.device, shapes, weights, timings, cores, split)
        cached = timings.cached
        busy = round(other.cores, 2)
        where = (f"cached in {timings.path}" if cached else
                 f"measured in {time.monotonic() - t0:.1f} s while other processes used {busy} cores")
        if busy < auto.QUIET_CORES:  # a busy machine's times decide this launch only: the next one measures again
            timings.save({"machine": identity, "torch": torch.__version__, "shapes": shapes, "cores_elsewhere": busy})
            where += "" if cached else f", cached in {timings.path}"
        elif not cached:
            where += ", not cached: the machine was busy"
        print(f"asyncrl: auto settings on {identity['cpu']} ({', '.join(identity['isa']) or 'no avx2'}, "
              f"{cores} cores; {where})", file=out)
    else:
        choices = (auto.decide_precision(cfg, plan.device, None)
                   + auto.decide_threads(cfg, plan.device, None, cores, split)
                   + auto.decide_attention(cfg, plan.device, None, shapes["attention"]))
    for c in choices:
        print(f"asyncrl: {c.line()}", file=out)
    config = auto.apply(cfg, choices)
    if auto.mismatch_uncorrected(config):
        rollout, trainer = auto.compute_dtypes(config)
        print(f"asyncrl: note: the rollout runs in {rollout}, the trainer in {trainer}, and no rollout correction is "
              "on: per-token ratios of 0.6–1.5 go uncorrected", file=out)
    resolved = resolve_plan(config, hardware=plan.hardware, derived=plan.derived, provenance=plan.provenance,
                            cores=cores)
    resolved = dataclasses.replace(resolved, layout_error=plan.layout_error)
    return resolved, auto.record(identity, shapes, measured, choices, cached, weights,
                                  None if cached else busy)
