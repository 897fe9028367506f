"""`"auto"` settings decided from a measurement on the machine at hand: `trainer.precision`, `rollout.dtype`,
`resources.{trainer,rollout}.cpu_threads` and `trainer.attn_implementation`.

This module is the pure part: the shapes to measure, the decisions, and the config they resolve to. The
measurement (`engine.launch.probe`, torch, cached per machine and shape) is the only impure part; the driver
runs it at launch and reports the choice in one line per setting (never in `validate`, `plan` or `--dry-run`,
which show "auto: measured at launch").

Measured shapes (rows × in × out of one matmul, the run's real ones, read from the model's config.json):

    trainer       R_t × h × i    R_t = ppo_micro_batch_size_per_gpu · (max_prompt_length / 2 + max_response_length)
    lm_head       R_h × h × V    the trainer's LM head (R_h = min(R_t, 64): the ratio, not the time, is wanted)
    decode        R_d × h × i    R_d = min(max(n, max_num_seqs), n · ppo_mini_batch_size · require_batches)
    decode_head   R_d × h × V    the sampler's LM head, one decode step

    attention     B × S × H × K × d × n × r   one attention fwd + bwd of the trainer: B rows
                  (ppo_micro_batch_size_per_gpu; with use_dynamic_bsz ppo_max_token_len_per_gpu / S; lowered until
                  B·H·S² ≤ `ATTN_SCORES`) of S = max_prompt_length / 2 + max_response_length causal positions,
                  H query / K key-value heads of width d (n = r = 0). Where the trainer forwards a group's prompt
                  once (`trainer.shared_prompt` on torch / FSDP2, when `prompt_sharing.group_pays` for a group of
                  rollout.n rows), the sequence it really runs instead: B = the micro-batch's rows / n groups, each
                  of S = max_prompt_length / 2 + n·r positions (r = max_response_length) under the shared-prompt
                  mask (`engine.trainer.shared_prefix.group_allowed`)

(h = hidden_size, i = intermediate_size, V = vocab_size; rows capped at `MAX_ROWS`.) The trainer is timed under
bf16 autocast over fp32 weights (what `trainer.precision = "bf16"` runs), the rollout with bf16 weights (what
`rollout.dtype = "bf16"` loads).

A role's time is its shapes' times weighted by how much of its step each stands for (`step_weights`), per
token: w_trainer = L·e / R_t and w_lm_head = f / R_h for the trainer, w_decode = L·e / R_d and w_decode_head =
1 / R_d for the rollout, where e = (2·h·H·d + 2·h·K·d + 3·h·i_a) / (h·i) counts one layer's matmuls in units of
the measured one (H, K heads of width d; i_a = i, or experts per token × the expert width for MoE), L layers,
and f = max_response_length / (max_prompt_length / 2 + max_response_length) the share of the trainer's tokens
that reach the LM head (n·r / S of the shared sequence where the prompt is shared). (Unweighted, one LM-head
matmul would count as much as all L layers: on an Intel Xeon with AMX, bf16 ran the layer shape 2.8× fp32 but
a 64-row LM head 0.84×, and the plain sum chose fp32.)

Decisions, with s = fp32 time ÷ bf16 time of a role (trainer: trainer + lm_head; rollout: decode +
decode_head) and g = the same time's 1-thread ÷ C-thread ratio, in the role's chosen precision:

    precision   bf16 if s ≥ BF16_MIN_SPEEDUP, else fp32        (on cuda / npu: bf16, nothing measured)
    cpu_threads C (every core) if g ≥ THREADS_MIN_SPEEDUP, else the pool's share of the automatic split
                (`engine.plan.placement.actor_resources`: no oversubscription)
    attention   eager if sdpa time ÷ eager time ≥ EAGER_MIN_SPEEDUP (timed in the trainer's chosen precision
                and threads), else sdpa; sdpa without measuring on cuda / npu and when S > `ATTN_MAX_POSITIONS`
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from engine.plan.prompt_sharing import group_pays, may_share

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
EAGER_MIN_SPEEDUP = 1.1
"""Eager attention is chosen when its fwd + bwd is at least this much faster than sdpa's (it also keeps B·H·S²
probabilities for the backward, so a tie goes to sdpa)."""
ATTN_MAX_POSITIONS = 1024
"""Above this many positions sdpa is chosen without measuring: eager's scores grow as S² in time and memory,
while the flash kernel's fixed-block overhead that eager beats at short rows does not."""
ATTN_SCORES = 1 << 24
"""B·H·S² scores of the measured attention at most (B lowered to fit: the ratio, not the time, is wanted)."""
QUIET_CORES = 0.5
"""Thread scaling is trusted, and timings cached, only when other processes used less than this many cores while
they were measured. Timing C threads needs C free cores: with one core busy elsewhere, 2 threads read 0.6–1.1×
one thread, and a cached 1.09× kept a quiet 2-core Xeon on one trainer thread (1.57–2.01× when quiet)."""
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
            "resources.rollout.cpu_threads": res.rollout.cpu_threads == "auto",
            "trainer.attn_implementation": cfg.trainer.attn_implementation == "auto"}


def has_auto(cfg: RunConfig) -> bool:
    """True when any setting waits for the launch-time measurement."""
    return any(wanted(cfg).values())


def trainer_positions(cfg: RunConfig) -> int:
    """S: the positions of a typical trainer row, max_prompt_length / 2 + max_response_length."""
    return cfg.data.max_prompt_length // 2 + cfg.data.max_response_length


def probe_shapes(cfg: RunConfig, arch: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The measured shapes of the run (see the module docstring): matmuls as (rows, in, out), the attention as
    (rows, positions, heads, kv heads, head dim); `arch`: the model's config.json (a multimodal model's
    `text_config` is used when present)."""
    text = arch.get("text_config") or arch
    h, i, v = int(text["hidden_size"]), int(text["intermediate_size"]), int(text["vocab_size"])
    t, r = cfg.trainer, cfg.rollout
    positions = trainer_positions(cfg)
    train_rows = min(MAX_ROWS, t.ppo_micro_batch_size_per_gpu * positions)
    decode_rows = min(MAX_ROWS, max(r.n, r.max_num_seqs),
                      r.n * t.ppo_mini_batch_size * cfg.async_training.require_batches)
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or h // heads)
    micro_rows = t.ppo_max_token_len_per_gpu // positions if t.use_dynamic_bsz else t.ppo_micro_batch_size_per_gpu
    n = r_len = 0
    if shares_prompt(cfg):
        n, r_len = r.n, cfg.data.max_response_length
        micro_rows, positions = max(1, micro_rows // n), cfg.data.max_prompt_length // 2 + n * r_len
    attn_rows = max(1, min(micro_rows, ATTN_SCORES // (heads * positions * positions)))
    return {"trainer": (train_rows, h, i), "lm_head": (min(train_rows, HEAD_ROWS), h, v),
            "decode": (decode_rows, h, i), "decode_head": (decode_rows, h, v),
            "attention": (attn_rows, positions, heads, kv_heads, head_dim, n, r_len)}


def shares_prompt(cfg: RunConfig) -> bool:
    """Whether the trainer forwards a typical group's prompt once: `prompt_sharing.may_share`, and
    `prompt_sharing.group_pays` for rollout.n rows of max_prompt_length / 2 + max_response_length tokens."""
    d = cfg.data
    return may_share(cfg) and group_pays(cfg.rollout.n, d.max_prompt_length // 2, d.max_response_length,
                                         d.max_response_length)


def step_weights(cfg: RunConfig, arch: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, float]:
    """Each measured matmul shape's weight in its role's time (see the module docstring): per token of the step,
    how many such matmuls it runs, divided by the measured matmul's rows."""
    text = arch.get("text_config") or arch
    h, i = int(text["hidden_size"]), int(text["intermediate_size"])
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or h // heads)
    experts_per_token = text.get("num_experts_per_tok")
    active = int(experts_per_token) * int(text.get("moe_intermediate_size") or i) if experts_per_token else i
    per_layer = (2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * active) / (h * i)
    layers = int(text.get("num_hidden_layers") or 1) * per_layer
    d = cfg.data
    _, positions, *_, n, r_len = shapes["attention"]
    head_share = n * r_len / positions if n else d.max_response_length / trainer_positions(cfg)
    return {"trainer": layers / shapes["trainer"][0], "lm_head": head_share / shapes["lm_head"][0],
            "decode": layers / shapes["decode"][0], "decode_head": 1.0 / shapes["decode_head"][0]}


def role_seconds(times: dict[str, float], weights: dict[str, float], role: str) -> float:
    """A role's weighted time per token from its shapes' `times` (one precision and thread count)."""
    return sum(weights[s] * times[s] for s in ROLE_SHAPES[role])


CACHE_FORMAT = 2
"""Version of the cached timings (2: cached only when the machine was quiet while measuring, by CPU time spent
elsewhere; format 1 trusted the 1-minute load average, and cached thread timings taken beside a busy core)."""


def cache_key(identity: dict[str, Any], shapes: dict[str, tuple[int, ...]], torch_version: str) -> str:
    """The measurement's cache key: the cache format, the machine (CPU model, ISA flags, cores), torch, and the
    shapes."""
    doc = json.dumps({"format": CACHE_FORMAT, "machine": identity, "torch": torch_version, "shapes": shapes},
                     sort_keys=True)
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


def decide_precision(cfg: RunConfig, device: str, times: dict[str, dict[str, float]] | None,
                     weights: dict[str, float] | None = None) -> list[Choice]:
    """The choices for `cfg`'s "auto" precisions. `times`: `{shape: {"fp32": s, "bf16": s}}` (None on
    accelerators, where bf16 is chosen without measuring); `weights`: `step_weights` (needed with `times`)."""
    want, out = wanted(cfg), []
    for role in ROLES:
        key = "trainer.precision" if role == "trainer" else "rollout.dtype"
        if not want[key]:
            continue
        if device in ACCELERATED or times is None:
            out.append(Choice(key, "bf16", None, f"{device} computes in bf16 natively (not measured)"))
            continue
        if weights is None:
            raise ValueError("measured times need their step weights (engine.plan.auto.step_weights)")
        out.append(choose_precision(role, *(role_seconds({s: t[mode] for s, t in times.items()}, weights, role)
                                            for mode in ("fp32", "bf16"))))
    return out


def choose_attention(sdpa_s: float, eager_s: float, shape: tuple[int, ...], threads: int = 0) -> Choice:
    """eager when sdpa time ÷ eager time ≥ EAGER_MIN_SPEEDUP, else sdpa (`shape`: the measured attention,
    timed on `threads` threads)."""
    ratio = sdpa_s / eager_s
    value = "eager" if ratio >= EAGER_MIN_SPEEDUP else "sdpa"
    what = f"{shape[0]} × {shape[1]} positions" + (" (shared prompts)" if len(shape) > 5 and shape[5] else "")
    what += f", {threads} thread{'s' if threads > 1 else ''}" if threads else ""
    why = f"eager {ratio:.2f}× sdpa here, fwd + bwd at {what} (eager from {EAGER_MIN_SPEEDUP}×)"
    return Choice("trainer.attn_implementation", value, round(ratio, 3), why)


def decide_attention(cfg: RunConfig, device: str, times: dict[str, float] | None,
                     shape: tuple[int, ...]) -> list[Choice]:
    """The choice for an "auto" `trainer.attn_implementation`. `times`: `{"sdpa": s, "eager": s}` (None when
    not measured: on accelerators and above `ATTN_MAX_POSITIONS`, where sdpa is chosen)."""
    if not wanted(cfg)["trainer.attn_implementation"]:
        return []
    key = "trainer.attn_implementation"
    if device in ACCELERATED:
        return [Choice(key, "sdpa", None, f"{device}: flash attention through sdpa (not measured)")]
    if shape[1] > ATTN_MAX_POSITIONS:
        return [Choice(key, "sdpa", None, f"{shape[1]} positions > {ATTN_MAX_POSITIONS}: eager's S² scores lose "
                                          "(not measured)")]
    if times is None:
        return [Choice(key, "sdpa", None, "not measured")]
    return [choose_attention(times["sdpa"], times["eager"], shape, int(times.get("threads", 0)))]


def measures_attention(cfg: RunConfig, device: str, shape: tuple[int, ...]) -> bool:
    """Whether the launch times the attention (an "auto" kernel on CPU at most `ATTN_MAX_POSITIONS` positions)."""
    return (wanted(cfg)["trainer.attn_implementation"] and device not in ACCELERATED
            and shape[1] <= ATTN_MAX_POSITIONS)


def decide_threads(cfg: RunConfig, device: str, times: dict[str, dict[str, float]] | None, cores: int,
                   split: dict[str, int]) -> list[Choice]:
    """The choices for `cfg`'s "auto" thread counts. `times`: `{role: {"1": s, "all": s, "elsewhere": cores}}`
    (None off CPU, where the setting keeps its automatic value; `elsewhere` = the cores other processes used
    while "all" was timed: from `QUIET_CORES` on the role keeps the split); `split`: each role's threads in the
    automatic split."""
    want, out = wanted(cfg), []
    for role in ROLES:
        key = f"resources.{role}.cpu_threads"
        if not want[key]:
            continue
        if device != "cpu" or times is None:
            out.append(Choice(key, 0, None, f"{device}: threads follow the accelerators (not measured)"))
            continue
        busy = times[role].get("elsewhere", 0.0)
        if busy >= QUIET_CORES:
            out.append(Choice(key, split[role], None, f"not measured: other processes used {busy:.2f} cores while "
                              f"it measured, so the split's {split[role]} (relaunch on a quiet machine to measure)"))
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


def trainer_threads(cfg: RunConfig, choices: list[Choice], split: dict[str, int]) -> int:
    """The intra-op threads the trainer runs with once `choices` apply: its `cpu_threads` choice, else the
    plan's (`split["trainer"]`: a fixed `cpu_threads`, or the automatic split)."""
    for c in choices:
        if c.key == "resources.trainer.cpu_threads" and int(c.value) > 0:
            return int(c.value)
    return max(1, int(split["trainer"]))


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
           choices: list[Choice], cached: bool, weights: dict[str, float] | None = None,
           cores_elsewhere: float | None = None) -> dict[str, Any]:
    """What `<run dir>/machine.json` holds: the machine, the shapes and their step weights, the times (and the
    cores other processes used while they were taken; None when read from the cache), and each choice with its
    rule."""
    return {"machine": identity, "shapes": shapes, "weights": weights, "measured": measured, "cached": cached,
            "cores_elsewhere": cores_elsewhere,
            "choices": [asdict(c) for c in choices],
            "rules": {"bf16_min_speedup": BF16_MIN_SPEEDUP, "threads_min_speedup": THREADS_MIN_SPEEDUP,
                      "eager_min_speedup": EAGER_MIN_SPEEDUP, "attn_max_positions": ATTN_MAX_POSITIONS}}
