"""`"auto"` settings decided from a measurement on the machine at hand: `trainer.precision`, `rollout.dtype` and
`resources.{trainer,rollout}.cpu_threads`.

This module is the pure part: the shapes to measure, the decisions, and the config they resolve to. The
measurement (`engine.launch.probe`, torch, cached per machine and shape) is the only impure part; the driver
runs it at launch and reports the choice in one line per setting (never in `validate`, `plan` or `--dry-run`,
which show "auto: measured at launch").

Measured shapes (rows × in × out of one matmul, the run's real ones, read from the model's config.json):

    trainer       R_t × h × i    R_t = ppo_micro_batch_size_per_gpu · (max_prompt_length / 2 + max_response_length)
    lm_head       R_h × h × V    the trainer's LM head (R_h = min(R_t, 64): the ratio, not the time, is wanted)
    decode        R_d × h × i    R_d = min(max(n, max_num_seqs), n · ppo_mini_batch_size · require_batches)
    decode_head   R_d × h × V    the sampler's LM head, one decode step

(h = hidden_size, i = intermediate_size, V = vocab_size; rows capped at `MAX_ROWS`.) The trainer is timed under
bf16 autocast over fp32 weights (what `trainer.precision = "bf16"` runs), the rollout with bf16 weights (what
`rollout.dtype = "bf16"` loads).

Decisions, with s = fp32 time ÷ bf16 time summed over a role's shapes (trainer: trainer + lm_head; rollout:
decode + decode_head) and g = the same sum's 1-thread time ÷ C-thread time, in the role's chosen precision:

    precision   bf16 if s ≥ BF16_MIN_SPEEDUP, else fp32        (on cuda / npu: bf16, nothing measured)
    cpu_threads C (every core) if g ≥ THREADS_MIN_SPEEDUP, else the pool's share of the automatic split
                (`engine.plan.placement.actor_resources`: no oversubscription)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

BF16_MIN_SPEEDUP = 1.1
"""bf16 is chosen when it is at least this much faster than fp32 (a margin over timing noise: bf16 also costs
accuracy, so a tie goes to fp32)."""
THREADS_MIN_SPEEDUP = 1.25
"""A pool takes every core when C threads run its shape at least this much faster than one (C = 2: 62 % of
perfect scaling); else the other role would lose more than this one gains."""
MAX_ROWS = 512
"""Rows of a measured matmul at most (the measurement stays a few seconds)."""
HEAD_ROWS = 64
"""Rows of the trainer's measured LM-head matmul at most (the largest matrix: V columns)."""
ROLES = ("trainer", "rollout")
ROLE_SHAPES = {"trainer": ("trainer", "lm_head"), "rollout": ("decode", "decode_head")}
"""The shapes whose times are summed for a role's decisions."""
ACCELERATED = ("cuda", "npu")


@dataclass(frozen=True)
class Choice:
    """One resolved "auto" setting: the config key, the value chosen, the measured ratio and the rule."""

    key: str
    value: Any
    ratio: float | None
    why: str

    def line(self) -> str:
        """The launch line: `precision auto (trainer): bf16 1.80× fp32 here → bf16`."""
        return f"{self.key} auto: {self.why} → {self.value}"


def wanted(cfg: RunConfig) -> dict[str, bool]:
    """Which settings are "auto": `trainer.precision`, `rollout.dtype`, and each pool's `cpu_threads`."""
    res = cfg.resources
    return {"trainer.precision": cfg.trainer.precision == "auto", "rollout.dtype": cfg.rollout.dtype == "auto",
            "resources.trainer.cpu_threads": res.trainer.cpu_threads == "auto",
            "resources.rollout.cpu_threads": res.rollout.cpu_threads == "auto"}


def has_auto(cfg: RunConfig) -> bool:
    """True when any setting waits for the launch-time measurement."""
    return any(wanted(cfg).values())


def probe_shapes(cfg: RunConfig, arch: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    """The matmul shapes (rows, in, out) of the run (see the module docstring); `arch`: the model's config.json
    (a multimodal model's `text_config` is used when present)."""
    text = arch.get("text_config") or arch
    h, i, v = int(text["hidden_size"]), int(text["intermediate_size"]), int(text["vocab_size"])
    d, t, r = cfg.data, cfg.trainer, cfg.rollout
    train_rows = min(MAX_ROWS, t.ppo_micro_batch_size_per_gpu * (d.max_prompt_length // 2 + d.max_response_length))
    decode_rows = min(MAX_ROWS, max(r.n, r.max_num_seqs),
                      r.n * t.ppo_mini_batch_size * cfg.async_training.require_batches)
    return {"trainer": (train_rows, h, i), "lm_head": (min(train_rows, HEAD_ROWS), h, v),
            "decode": (decode_rows, h, i), "decode_head": (decode_rows, h, v)}


def cache_key(identity: dict[str, Any], shapes: dict[str, tuple[int, int, int]], torch_version: str) -> str:
    """The measurement's cache key: the machine (CPU model, ISA flags, cores), torch, and the shapes."""
    doc = json.dumps({"machine": identity, "torch": torch_version, "shapes": shapes}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def choose_precision(role: str, fp32_s: float, bf16_s: float) -> Choice:
    """bf16 when fp32 time ÷ bf16 time ≥ BF16_MIN_SPEEDUP, else fp32."""
    ratio = fp32_s / bf16_s
    value = "bf16" if ratio >= BF16_MIN_SPEEDUP else "fp32"
    key = "trainer.precision" if role == "trainer" else "rollout.dtype"
    return Choice(key, value, round(ratio, 3), f"bf16 {ratio:.2f}× fp32 here (bf16 from {BF16_MIN_SPEEDUP}×)")


def choose_threads(role: str, one_s: float, all_s: float, cores: int, share: int) -> Choice:
    """Every core when 1-thread time ÷ `cores`-thread time ≥ THREADS_MIN_SPEEDUP, else `share` (the split's)."""
    ratio = one_s / all_s
    value = cores if ratio >= THREADS_MIN_SPEEDUP else share
    why = (f"{cores} threads {ratio:.2f}× 1 thread here (every core from {THREADS_MIN_SPEEDUP}×, else the "
           f"split's {share})")
    return Choice(f"resources.{role}.cpu_threads", value, round(ratio, 3), why)


def decide_precision(cfg: RunConfig, device: str, times: dict[str, dict[str, float]] | None) -> list[Choice]:
    """The choices for `cfg`'s "auto" precisions. `times`: `{shape: {"fp32": s, "bf16": s}}` (None on
    accelerators, where bf16 is chosen without measuring)."""
    want, out = wanted(cfg), []
    for role in ROLES:
        key = "trainer.precision" if role == "trainer" else "rollout.dtype"
        if not want[key]:
            continue
        if device in ACCELERATED or times is None:
            out.append(Choice(key, "bf16", None, f"{device} computes in bf16 natively (not measured)"))
            continue
        shapes = ROLE_SHAPES[role]
        out.append(choose_precision(role, sum(times[s]["fp32"] for s in shapes),
                                    sum(times[s]["bf16"] for s in shapes)))
    return out


def decide_threads(cfg: RunConfig, device: str, times: dict[str, dict[str, float]] | None, cores: int,
                   split: dict[str, int]) -> list[Choice]:
    """The choices for `cfg`'s "auto" thread counts. `times`: `{role: {"1": s, "all": s}}` (None off CPU, where
    the setting keeps its automatic value); `split`: each role's threads in the automatic split."""
    want, out = wanted(cfg), []
    for role in ROLES:
        key = f"resources.{role}.cpu_threads"
        if not want[key]:
            continue
        if device != "cpu" or times is None:
            out.append(Choice(key, 0, None, f"{device}: threads follow the accelerators (not measured)"))
            continue
        out.append(choose_threads(role, times[role]["1"], times[role]["all"], cores, split[role]))
    return out


def resolved_precision(cfg: RunConfig, choices: list[Choice], role: str) -> str:
    """The precision `role` runs in once `choices` apply ("fp32" or "bf16"), for measuring its thread scaling."""
    key = "trainer.precision" if role == "trainer" else "rollout.dtype"
    for c in choices:
        if c.key == key:
            return str(c.value)
    from engine.config.precision import SHORT

    return SHORT[compute_dtypes(cfg)[0 if role == "rollout" else 1]]


def compute_dtypes(cfg: RunConfig) -> tuple[str, str]:
    """(rollout, trainer) compute dtype names ("float32" / "bfloat16"; "auto" until the launch decides)."""
    from engine.config.precision import LONG, policy_of

    rollout = LONG[cfg.rollout.dtype] if cfg.rollout.dtype else cfg.model.dtype
    return rollout, policy_of(cfg).compute


def mismatch_uncorrected(cfg: RunConfig) -> bool:
    """The rollout and the trainer compute in different precisions and no rollout correction is on."""
    rollout, trainer = compute_dtypes(cfg)
    rc = cfg.algorithm.rollout_correction
    return rollout != trainer and rc.rollout_is is None and rc.rollout_rs is None


def apply(cfg: RunConfig, choices: list[Choice]) -> RunConfig:
    """`cfg` with each chosen value in place of its "auto"."""
    from engine.config.schema import RunConfig

    doc = cfg.model_dump(mode="json")
    for c in choices:
        *path, last = c.key.split(".")
        node = doc
        for part in path:
            node = node[part]
        node[last] = c.value
    return RunConfig.model_validate(doc)


def record(identity: dict[str, Any], shapes: dict[str, Any], measured: dict[str, Any] | None,
           choices: list[Choice], cached: bool) -> dict[str, Any]:
    """What `<run dir>/machine.json` holds: the machine, the shapes, the times, and each choice with its rule."""
    return {"machine": identity, "shapes": shapes, "measured": measured, "cached": cached,
            "choices": [asdict(c) for c in choices],
            "rules": {"bf16_min_speedup": BF16_MIN_SPEEDUP, "threads_min_speedup": THREADS_MIN_SPEEDUP}}
