"""The plan's cost model: what a decode step, a prefill token, a training token and a weight sync cost on a
run's layout, and the response-length distribution — each figure with the source it came from.

Sources, in order (a later one only fills what an earlier one left empty):
1. a calibration file written from a measured run (`asyncrl plan --calibrate RUN_DIR`, or declared by hand);
2. measured figures shipped with the hardware preset (none is shipped yet for vLLM/Megatron at scale);
3. an estimate from the model's config.json and the hardware preset, with the efficiency factors below:

    decode step (one replica of tp accelerators)  a = 2·P_total / (tp · BW · η_bw)       (every expert is read
                                                                                         at RL batch sizes)
    per running row and step                      b = 2·P_active / (tp · F · η_dec) + kv_bytes(tp) · ctx / (BW · η_bw)
    prefill, per prompt token                     p = 2·P_active / (tp · F · η_pre)
    training, per response token on W ranks       c = (6 + 2·passes) · (P_active + L·h·ctx) / (W · F · MFU)
    training, fixed per local step                prompt tokens of the step × c + 16·P_total / (W · BW · η_bw)
                                                  (a group's prompt counted n times, or once where the trainer
                                                  shares it: `engine.plan.prompt_sharing.group_pays`)
    weight sync (the engine's pipeline, `engine.sync`)  with B = P_total·b_r bytes (`engine.plan.memory.
        sync_bytes`: the export dtype, bf16 for the production presets), n = ⌈B / bucket⌉:
        gather   = B·(1 − 1/g) / gather bandwidth     (TP·EP shards to the sender, g = trainer TP·EP; NVLink)
        transfer = B / link bandwidth                 (the sender's link to the replicas; a broadcast is
                                                      pipelined, so the number of receivers does not count)
        load     = 2·B / (BW · η_bw)                  (each receiver reads its buffer and writes the weights)
        sync     = max(stages) + (Σ stages − max) / n (bucket k+1 gathered while k travels and k−1 loads)

with BW the accelerator's memory bandwidth, F its dense bf16 peak, ctx = prompt + mean response / 2,
passes = log-prob passes besides the update (π_old unless bypass, π_ref with a KL loss).
Without a calibration, responses are assumed uniform on 1..max/2 with 5 % running to the limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from engine.loop.dispatch import replica_slots
from engine.plan.sizes import (
    effective_staleness,
    max_required_samples,
    required_samples,
    rollout_replicas,
    trainer_world,
)
from engine.plan.memory import export_bytes, sync_bytes
from engine.plan.prompt_sharing import group_pays, may_share

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

ETA_BW = 0.6
"""Fraction of peak memory bandwidth a decode step reaches."""
ETA_DECODE = 0.4
"""Fraction of peak bf16 FLOP/s the per-row part of a decode step reaches."""
ETA_PREFILL = 0.5
TRAIN_MFU_DENSE = 0.3
TRAIN_MFU_MOE = 0.2
SYNC_LINK_GBPS = {"nvlink+ib": 45.0, "hccs+roce": 22.0, "hccs+ub": 45.0, "nvlink": 150.0, "pcie": 20.0,
                  "none": 1.0}
"""Usable bandwidth (GB/s) of the weight sync's sender (trainer rank 0) to the replicas, by interconnect. The
trainer and rollout pools are separate nodes, so it is rank 0's NIC: 400 Gb/s InfiniBand ≈ 45 GB/s usable,
200 Gb/s RoCE ≈ 22 GB/s; a single node (`nvlink`) uses NVLink. `none` (CPU): a placeholder — the CPU preset
declares no memory bandwidth, so no CPU sync is estimated (`estimate` returns nothing); a CPU plan takes its
`sync_s` from a calibration of a measured run (`asyncrl plan --calibrate`), i.e. from whatever transport that
run used (`rollout.weight_sync = "auto"`: shared memory on one host, whose time is the pack and load copies,
not a link)."""
SYNC_GATHER_GBPS = {"nvlink+ib": 150.0, "hccs+roce": 90.0, "hccs+ub": 150.0, "nvlink": 150.0, "pcie": 20.0,
                    "none": 1.0}
"""Bandwidth (GB/s) of the trainer's gather of TP / EP shards to the sender, within a node."""
SYNC_BUCKET_BYTES = 512 * 2**20
"""`rollout.weight_sync_bucket_mb`'s default."""
TAIL_DEFAULT = 0.05

COST_FIELDS = ("decode_step_s", "row_step_s", "prefill_token_s", "train_token_s", "train_step_s", "sync_s",
               "long_tail", "short_max")


class CostsUnavailable(ValueError):
    """No source gives a figure the plan needs."""


@dataclass(frozen=True)
class Layout:
    """What the plan needs from a run config."""

    name: str
    mode: str
    n: int
    required_samples: int
    trigger: int
    staleness: float
    partial_rollout: bool
    max_staleness_versions: int | None
    stale_policy: str
    max_new_tokens: int
    prompt_tokens: int
    seqs_per_call: int
    replicas: int
    rollout_tp: int
    trainer_world: int
    trainer_model_parallel: int
    total_versions: int | None
    log_prob_passes: int
    device: str = "cuda"
    trainer_ep: int = 1
    """Megatron expert parallelism: the EP group's experts are gathered to the sync's sender too."""
    shared_prompt: bool = False
    """The trainer forwards a group's prompt once (`engine.plan.prompt_sharing.may_share`) where it pays
    (`group_pays`)."""
    slots: int = 1
    """Dispatches one replica serves at once: 1 models one dispatch (`seqs_per_call` rows) per replica, got
    back whole (asyncrl's loop before it streamed); a server with continuous batching that takes each prompt
    on its own (asyncrl's streaming rollouter, verl's `concurrent_samples_per_replica`) is that many.
    `from_config` takes asyncrl's (`plan_slots`)."""
    sync_param_bytes: int = 2
    """b_r: bytes per parameter a weight sync moves (`engine.plan.memory.export_bytes`: the replicas' dtype)."""
    colocated: bool = False
    """Trainer and rollout on the same accelerators (verl's colocate baseline, `engine.predict.prediction.
    colocated_layout`): a training step waits until generation is done."""

    @property
    def rollout_world(self) -> int:
        return self.replicas * self.rollout_tp

    @property
    def accelerators(self) -> int:
        return self.rollout_world + self.trainer_world

    @classmethod
    def from_config(cls, cfg: RunConfig, total_versions: int | None, device: str = "cuda") -> "Layout":
        """From a validated RunConfig (attribute reads only). Prompts are assumed half of max_prompt_length."""
        a, t, r = cfg.async_training, cfg.trainer, cfg.rollout
        tp = r.tensor_parallel_size
        sync = a.mode == "sync"
        passes = (0 if cfg.algorithm.rollout_correction.bypass_mode else 1) + (1 if t.use_kl_loss else 0)
        return cls(
            name=cfg.name, mode="sync" if sync else "async", n=r.n,
            required_samples=required_samples(cfg), trigger=a.trigger_parameter_sync_step,
            staleness=float(effective_staleness(cfg)),
            partial_rollout=bool(a.partial_rollout) and not sync, max_staleness_versions=a.max_staleness_versions,
            stale_policy=a.stale_policy, max_new_tokens=cfg.data.max_response_length,
            prompt_tokens=max(1, cfg.data.max_prompt_length // 2), seqs_per_call=max(r.n, r.max_num_seqs),
            replicas=rollout_replicas(cfg), rollout_tp=tp, trainer_world=trainer_world(cfg),
            trainer_model_parallel=t.tp * t.pp * t.cp if t.backend == "megatron" else 1,
            total_versions=total_versions, log_prob_passes=passes, device=device,
            slots=plan_slots(max(r.n, r.max_num_seqs), r.n, rollout_replicas(cfg), max_required_samples(cfg)),
            trainer_ep=t.ep if t.backend == "megatron" else 1,
            shared_prompt=may_share(cfg), sync_param_bytes=export_bytes(cfg),
        )


SIM_REPLICAS = 32
"""The most simulated replicas a default plan models (R replicas of k slots are R·k simulated replicas, and
the simulation's cost grows with them: 24 replicas × 12 slots took 15× the CPU time of 1 slot)."""


def plan_slots(rows: int, n: int, replicas: int, in_flight: int) -> int:
    """The slots a plan models per replica (at least 1; `asyncrl plan --slots K` models exactly K).

    The streaming rollouter sends a replica up to `replica_slots(rows, n)` dispatches of one group each
    (`engine.loop.dispatch`). The simulator models k slots as k replicas of ⌊rows / k⌋ rows stepping at
    a + k·b·rows_per_slot — exact when every slot is full — so k is the largest slot count, at most that, at most
    ⌊SIM_REPLICAS / R⌋ (the simulation's cost), with which the G groups a replica has out at once
    (G = min(⌈in_flight / R⌉, ⌊rows / n⌋), in_flight = the staleness budget's `max_required_samples`) still
    fit in one round:  k · ⌊rows / (k·n)⌋ ≥ G."""
    r = max(1, replicas)
    groups = max(1, min(math.ceil(in_flight / r), rows // max(1, n)))
    for k in range(min(replica_slots(rows, n), groups, SIM_REPLICAS // r), 1, -1):
        if k * (rows // (k * n)) >= groups:
            return k
    return 1


@dataclass
class CostModel:
    """Seconds per unit of work (see the module docstring); `train_*` hold for `train_world` trainer ranks."""

    decode_step_s: float
    row_step_s: float
    prefill_token_s: float
    train_token_s: float
    train_step_s: float
    train_world: int
    sync_s: float
    long_tail: float
    short_max: int
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def train_at(self, world: int) -> tuple[float, float]:
        """(per-token, per-step) training cost on `world` ranks: linear data-parallel scaling."""
        f = self.train_world / max(1, world)
        return self.train_token_s * f, self.train_step_s * f

    def mean_response(self, max_new_tokens: int) -> float:
        """Mean response length of the distribution: tail · max + (1 − tail) · (short_max + 1) / 2."""
        return self.long_tail * max_new_tokens + (1 - self.long_tail) * (self.short_max + 1) / 2

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def estimate(layout: Layout, facts: Any, hw: Any) -> tuple[dict[str, float], list[str]]:
    """Source 3: figures from the model's facts (`ModelFacts`) and the hardware preset; (figures, notes).
    Returns what it can (nothing when the preset lacks a peak or a bandwidth)."""
    peak = getattr(hw, "bf16_tflops", None)
    bw_gbs = getattr(hw, "memory_bandwidth_gbs", None)
    if facts is None or not peak or not bw_gbs:
        return {}, []
    F, BW = peak * 1e12, bw_gbs * 1e9
    tp, world = layout.rollout_tp, layout.trainer_world
    short = max(1, layout.max_new_tokens // 2)
    mean_resp = TAIL_DEFAULT * layout.max_new_tokens + (1 - TAIL_DEFAULT) * (short + 1) / 2
    ctx = layout.prompt_tokens + mean_resp / 2
    p_act, p_tot = facts.params_active, facts.params_total
    kv = facts.kv_bytes_per_token(2, tp)
    mfu = TRAIN_MFU_MOE if facts.is_moe else TRAIN_MFU_DENSE
    per_token_fwd = 2 * (p_act + facts.layers * facts.hidden * ctx)
    c = (3 + layout.log_prob_passes) * per_token_fwd / (world * F * mfu)
    copies = layout.n  # a group's prompt, forwarded once per row or once (the trainer's shared-prompt forward)
    if layout.shared_prompt and group_pays(layout.n, layout.prompt_tokens, layout.max_new_tokens, mean_resp):
        copies = 1
    prompt_tokens_step = layout.required_samples * copies * layout.prompt_tokens
    sync_s, terms = sync_pipeline(p_tot, layout, getattr(hw, "interconnect", ""), BW)
    out = {
        "decode_step_s": 2 * p_tot / (tp * BW * ETA_BW),
        "row_step_s": 2 * p_act / (tp * F * ETA_DECODE) + kv * ctx / (BW * ETA_BW),
        "prefill_token_s": 2 * p_act / (tp * F * ETA_PREFILL),
        "train_token_s": c,
        "train_step_s": prompt_tokens_step * c + 16 * p_tot / (world * BW * ETA_BW),
        "sync_s": sync_s,
        "long_tail": TAIL_DEFAULT,
        "short_max": short,
    }
    notes = [f"estimate from config.json ({p_tot / 1e9:.1f}B total, {p_act / 1e9:.1f}B active) and "
             f"{hw.name} ({peak:g} TFLOP/s bf16, {bw_gbs:g} GB/s): η_bw={ETA_BW}, η_decode={ETA_DECODE}, "
             f"η_prefill={ETA_PREFILL}, train MFU={mfu}",
             "weight sync " + ", ".join(f"{k} {v:.3g}" for k, v in terms.items()),
             f"response lengths assumed: uniform 1..{short}, {TAIL_DEFAULT:.0%} run to {layout.max_new_tokens}"]
    return out, notes


def sync_pipeline(p_total: float, layout: Layout, interconnect: str, mem_bw: float) -> tuple[float, dict[str, float]]:
    """The weight sync's time from its terms (module docstring): (seconds, the terms by name)."""
    nbytes = sync_bytes(p_total, layout.sync_param_bytes)
    g = max(1, layout.trainer_model_parallel * layout.trainer_ep)
    gather = nbytes * (1 - 1 / g) / (SYNC_GATHER_GBPS.get(interconnect, 150.0) * 1e9)
    link = SYNC_LINK_GBPS.get(interconnect, 45.0)
    transfer = nbytes / (link * 1e9)
    load = 2 * nbytes / (mem_bw * ETA_BW)
    n = max(1, -(-int(nbytes) // SYNC_BUCKET_BYTES))
    stages = (gather, transfer, load)
    total = max(stages) + (sum(stages) - max(stages)) / n
    return total, {"bytes_gb": nbytes / 1e9, "buckets": float(n), "link_gb_s": link, "gather_s": gather,
                   "transfer_s": transfer, "load_s": load, "sync_s": total}


def resolve(layout: Layout, facts: Any = None, hw: Any = None, calibration: dict[str, Any] | None = None,
            calibration_name: str = "calibration") -> CostModel:
    """The cost model of `layout` from the sources in order; raises CostsUnavailable naming what is missing."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    train_world = layout.trainer_world
    if calibration:
        costs = calibration.get("costs", calibration)
        for k in COST_FIELDS:
            if costs.get(k) is not None:
                values[k], sources[k] = costs[k], calibration_name
        train_world = int(costs.get("train_world") or calibration.get("reference", {}).get("trainer_world")
                          or layout.trainer_world)
        notes += list(calibration.get("notes", []))
    est, est_notes = estimate(layout, facts, hw)
    used_estimate = False
    calibrated_train = "train_token_s" in values or "train_step_s" in values
    for k, v in est.items():
        if k not in values:
            if k in ("train_token_s", "train_step_s") and calibrated_train:
                values[k], sources[k] = 0.0, calibration_name  # a calibration's split of the training cost
                continue
            values[k], sources[k] = v, "estimate"
            used_estimate = True
            if k.startswith("train_"):
                train_world = layout.trainer_world
    if used_estimate:
        notes += est_notes
    values.setdefault("row_step_s", 0.0)
    values.setdefault("prefill_token_s", 0.0)
    values.setdefault("long_tail", TAIL_DEFAULT)
    values.setdefault("short_max", max(1, layout.max_new_tokens // 2))
    for k in ("row_step_s", "prefill_token_s", "long_tail", "short_max"):
        sources.setdefault(k, "default")
    if values.get("train_token_s") is not None or values.get("train_step_s") is not None:
        values.setdefault("train_token_s", 0.0)
        values.setdefault("train_step_s", 0.0)
    missing = [k for k in ("decode_step_s", "train_token_s", "sync_s") if values.get(k) is None]
    if missing:
        raise CostsUnavailable(
            f"no cost for {', '.join(missing)}: the model's config.json or the hardware's bf16_tflops / "
            f"memory_bandwidth_gbs are unknown; calibrate on a measured run (asyncrl plan --calibrate RUN_DIR) "
            f"and pass --calibration RUN_DIR/calibration.json")
    kw = {f.name: values[f.name] for f in fields(CostModel) if f.name in values}
    kw["short_max"] = max(1, int(kw["short_max"]))
    return CostModel(**kw, train_world=train_world, sources=sources, notes=notes)
