"""The plan's cost model: what a decode step, a prefill token, a training token and a weight sync cost on a
run's layout, and the response-length distribution — each figure with the source it came from.

Sources, in order (a later one only fills what an earlier one left empty):
1. a calibration file written from a measured run (`asyncrl plan --calibrate RUN_DIR`, or declared by hand);
2. measured figures shipped with the hardware preset (none is shipped yet for vLLM/Megatron at scale);
3. an estimate from the model's config.json and the hardware preset, with the efficiency factors below:

    decode step (one replica of tp accelerators)  a = 2·P_total / (tp · BW · η_bw)       (every expert is read
                                                                                         at RL batch sizes; a
                                                  replica of TP·PP·DP GPUs, experts over EP, or fp8 weights:
                                                  PP × one GPU's weight bytes / (BW · η_bw), `decode_bytes`)
    per running row and step                      b = 2·P_active / (tp · F · η_dec) + kv_bytes(tp) · ctx / (BW · η_bw)
    prefill, per prompt token                     p = 2·P_active / (tp · F · η_pre)
    training, per response token on W ranks       c = (6 + 2·passes) · (P_active + L·h·ctx) / (W · F · MFU)
                                                  (Megatron: MFU × the settings' efficiency,
                                                  `engine.plan.megatron_perf.update_efficiency`)
    training, fixed per local step                prompt tokens of the step × c + 16·P_total / (W · BW · η_bw)
                                                  (a group's prompt counted n times, or once where the trainer
                                                  shares it: `engine.plan.prompt_sharing.group_pays`)
    weight sync (the engine's pipeline, `engine.sync`)  with B = P_total·b_r bytes (`engine.plan.memory.sync_bytes`:
        the export dtype, bf16 for the production presets; fp8 rollout weights: (P − E)·(1 + 4/128²) + E·b_r,
        E = embedding + LM head), n = ⌈B / bucket⌉:
        gather   = B·(1 − 1/g) / gather bandwidth     (TP·EP shards to the sender, g = trainer TP·EP; NVLink)
        transfer = B / link bandwidth                 (the sender's link to the replicas; a broadcast is
                                                      pipelined, so the number of receivers does not count)
        load     = 2·B / (BW · η_bw)                  (each receiver reads its buffer and writes the weights)
        sync     = max(stages) + (Σ stages − max) / n (bucket k+1 gathered while k travels and k−1 loads)

with BW the accelerator's memory bandwidth, F its dense bf16 peak, ctx = prompt + mean response / 2,
passes = log-prob passes besides the update (π_old unless bypass, π_ref with a KL loss).
Without a calibration, responses are assumed uniform on 1..max/2 with 5 % running to the limit.

The loop itself is the run's: `Layout.loop` is the `LoopParams` the run starts from (`engine.loop.params`). Two
figures belong to the loop's features rather than to the hardware:
    keep rate K (dynamic sampling)   groups generated per group trained = 1 / K; K from a calibration on a run
                                     with `filter_groups`, `asyncrl plan --keep-rate`, else 1 (source printed)
    tool calls (multi-turn)          after `TOOL_CALL_P` of the model turns, `TOOL_LATENCY_S` each (assumed)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from engine.loop.dispatch import replica_slots
from engine.loop.params import LoopParams, loop_params
from engine.plan.sizes import max_required_samples, rollout_replicas, trainer_world
from engine.plan.megatron_perf import perf_values, update_efficiency
from engine.plan.memory import export_bytes, sync_bytes
from engine.plan.prompt_sharing import group_pays, may_share
from engine.plan.rollout_replica import replica_gpus

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
TOOL_CALL_P = 0.5
"""Multi-turn, assumed: half the model turns end with tool calls (the simulator draws 1-3 calls per such turn)."""
TOOL_LATENCY_S = 0.05
"""Multi-turn, assumed: a tool call takes 0.05 s (× U(0.5, 1.5); a sandboxed `calculator`/`lookup` call)."""

COST_FIELDS = ("decode_step_s", "row_step_s", "prefill_token_s", "train_token_s", "train_step_s", "sync_s",
               "long_tail", "short_max", "keep_rate")


class CostsUnavailable(ValueError):
    """No source gives a figure the plan needs."""


@dataclass(frozen=True)
class Layout:
    """What the plan needs from a run config: the loop cores' parameters (`loop`, by the run's own construction
    `engine.loop.params.loop_params`) and the placement and model facts the costs depend on."""

    name: str
    loop: LoopParams
    """The loop the run starts (mode, sizes, staleness, partial rollout, deterministic mode, dynamic sampling,
    multi-turn limits): what the simulator executes."""
    prompt_tokens: int
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
    rollout_gpus: int = 0
    """GPUs of one replica, TP·PP·DP (`engine.plan.rollout_replica.replica_gpus`; 0 = `rollout_tp`)."""
    rollout_shape: dict[str, Any] | None = None
    """The replica's `[rollout]` sizes and dtypes (tensor / pipeline / data / expert parallel, quantization,
    dtype, the model's dtype): what `engine.plan.rollout_replica.weights_per_gpu` reads. None = TP only, bf16."""
    rollout_quantization: str | None = None
    """`rollout.quantization`: "fp8" sends (P − E)·(1 + 4/128²) + E·2 bytes per sync instead of 2·P."""
    megatron_perf: dict[str, Any] | None = None
    """The Megatron settings resolved for the device (`engine.plan.megatron_perf.perf_values`); None = not
    megatron. Their `update_efficiency` divides the estimated training MFU."""
    sync_param_bytes: int = 2
    """b_r: bytes per parameter a weight sync moves (`engine.plan.memory.export_bytes`: the replicas' dtype)."""
    colocated: bool = False
    """Trainer and rollout on the same accelerators (verl's colocate baseline, `engine.predict.prediction.
    colocated_layout`): a training step waits until generation is done."""
    baseline: LoopParams | None = None
    """The same config in `mode = "sync"` (the loop of the sync and colocated baselines; None: `loop` itself)."""
    call_rows: int | None = None
    """Rows a replica generates together when not the loop's (the colocated baseline splits a version evenly)."""

    mode = property(lambda self: self.loop.mode)
    n = property(lambda self: self.loop.n)
    required_samples = property(lambda self: self.loop.required_samples)
    trigger = property(lambda self: self.loop.trigger)
    staleness = property(lambda self: self.loop.staleness)
    partial_rollout = property(lambda self: self.loop.rollout.partial_rollout)
    max_new_tokens = property(lambda self: self.loop.rollout.max_new_tokens)

    @property
    def seqs_per_call(self) -> int:
        """Rows a replica generates together: `max(n, max_num_seqs)`, or n in deterministic mode (the `hf`
        sampler generates each group alone there: `engine.rollout.hf.keyed`), or `call_rows`."""
        if self.call_rows is not None:
            return self.call_rows
        return self.loop.n if self.loop.rollout.deterministic else self.loop.rollout.seqs_per_call

    @property
    def replica_gpus(self) -> int:
        """GPUs of one replica (TP·PP·DP)."""
        return self.rollout_gpus or self.rollout_tp

    @property
    def rollout_world(self) -> int:
        return self.replicas * (self.rollout_gpus or self.rollout_tp)

    def to_json(self) -> dict[str, Any]:
        """The fields (the loop's params nested) and the loop's sizes at the top, for `--json`."""
        return {**asdict(self), "mode": self.mode, "n": self.n, "required_samples": self.required_samples,
                "trigger": self.trigger, "staleness": self.staleness, "partial_rollout": self.partial_rollout,
                "max_new_tokens": self.max_new_tokens, "seqs_per_call": self.seqs_per_call,
                "rollout_world": self.rollout_world}

    @property
    def accelerators(self) -> int:
        return self.rollout_world + self.trainer_world

    @classmethod
    def from_config(cls, cfg: RunConfig, total_versions: int | None, device: str = "cuda") -> "Layout":
        """From a validated RunConfig (attribute reads only). Prompts are assumed half of max_prompt_length."""
        t, r = cfg.trainer, cfg.rollout
        tp = r.tensor_parallel_size
        stream = r.total_rollout_steps or 0  # the plan simulates its own window (`LoopParams.for_versions`)
        loop = loop_params(cfg, stream)
        sync_cfg = cfg.model_copy(update={"async_training": cfg.async_training.model_copy(update={"mode": "sync"})})
        passes = (0 if cfg.algorithm.rollout_correction.bypass_mode else 1) + (1 if t.use_kl_loss else 0)
        rows = loop.n if loop.rollout.deterministic else loop.rollout.seqs_per_call
        return cls(
            name=cfg.name, loop=loop, baseline=loop_params(sync_cfg, stream),
            prompt_tokens=max(1, cfg.data.max_prompt_length // 2),
            replicas=rollout_replicas(cfg), rollout_tp=tp, trainer_world=trainer_world(cfg),
            trainer_model_parallel=t.tp * t.pp * t.cp if t.backend == "megatron" else 1,
            total_versions=total_versions, log_prob_passes=passes, device=device,
            slots=plan_slots(rows, r.n, rollout_replicas(cfg), max_required_samples(cfg)),
            trainer_ep=t.ep if t.backend == "megatron" else 1,
            shared_prompt=may_share(cfg), sync_param_bytes=export_bytes(cfg),
            rollout_gpus=replica_gpus(cfg), rollout_quantization=r.quantization,
            rollout_shape={"backend": r.backend, "tensor_parallel_size": tp,
                           "pipeline_model_parallel_size": r.pipeline_model_parallel_size,
                           "data_parallel_size": r.data_parallel_size, "expert_parallel_size": r.expert_parallel_size,
                           "quantization": r.quantization, "dtype": r.dtype, "model_dtype": cfg.model.dtype},
            megatron_perf=perf_values(cfg, device) if t.backend == "megatron" else None,
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
    keep_rate: float = 1.0
    """Dynamic sampling: the fraction K of sampled groups that carry a gradient (the trainer drops the others), so
    a trained group costs 1 / K generated groups. From a calibration on a run with `filter_groups` (its
    `asyncrl/count/filtered_groups`), `asyncrl plan --keep-rate K`, else assumed 1 (nothing dropped)."""
    tool_call_p: float = TOOL_CALL_P
    """Multi-turn: probability that a model turn ends with tool calls (assumed; no run measures it yet)."""
    tool_latency_s: float = TOOL_LATENCY_S
    """Multi-turn: median seconds of a tool call (assumed)."""

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
    if layout.megatron_perf is not None:  # the slower Megatron settings (engine.plan.megatron_perf)
        dp = max(1, world // max(1, layout.trainer_model_parallel))
        mfu *= update_efficiency(layout.megatron_perf, facts.is_moe, layout.trainer_ep, dp)
    per_token_fwd = 2 * (p_act + facts.layers * facts.hidden * ctx)
    c = (3 + layout.log_prob_passes) * per_token_fwd / (world * F * mfu)
    copies = layout.n  # a group's prompt, forwarded once per row or once (the trainer's shared-prompt forward)
    if layout.shared_prompt and group_pays(layout.n, layout.prompt_tokens, layout.max_new_tokens, mean_resp):
        copies = 1
    prompt_tokens_step = layout.required_samples * copies * layout.prompt_tokens
    embed = facts.vocab * facts.hidden * (1 if getattr(facts, "tied", False) else 2)
    sync_s, terms = sync_pipeline(p_tot, layout, getattr(hw, "interconnect", ""), BW, embed)
    out = {
        "decode_step_s": decode_bytes(layout, facts) / (BW * ETA_BW),
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


def decode_bytes(layout: Layout, facts: Any) -> float:
    """Weight bytes one decode step reads, on the replica's critical path: 2·P/tp for a tensor-parallel bf16
    replica; with pipeline stages, data × expert parallelism or fp8 weights, each stage's GPU reads its own
    weights (`engine.plan.rollout_replica.weights_per_gpu`) and the PP stages run one after another."""
    shape = layout.rollout_shape
    plain = shape is None or (not shape["quantization"] and shape["expert_parallel_size"] == 1
                              and shape["pipeline_model_parallel_size"] * shape["data_parallel_size"] == 1)
    if plain:
        return 2 * facts.params_total / layout.rollout_tp
    from types import SimpleNamespace

    from engine.plan.rollout_replica import weights_per_gpu

    # the estimate is for accelerators, where the replicas compute in bf16
    rollout = SimpleNamespace(**{k: v for k, v in shape.items() if k != "model_dtype"})
    rollout.dtype = "bf16"
    cfg = SimpleNamespace(rollout=rollout, model=SimpleNamespace(dtype="bfloat16"))
    return weights_per_gpu(cfg, facts) * shape["pipeline_model_parallel_size"]


def sync_pipeline(p_total: float, layout: Layout, interconnect: str, mem_bw: float,
                  embed: float = 0.0) -> tuple[float, dict[str, float]]:
    """The weight sync's time from its terms (module docstring): (seconds, the terms by name). With fp8 rollout
    weights B = (P − E)·(1 + 4/128²) + E·b_r (`embed` = E, the embedding and LM head, stay in b_r)."""
    nbytes = sync_bytes(p_total, layout.sync_param_bytes, embed, layout.rollout_quantization)
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
            calibration_name: str = "calibration", keep_rate: float | None = None) -> CostModel:
    """The cost model of `layout` from the sources in order; raises CostsUnavailable naming what is missing.
    `keep_rate` (`--keep-rate`) overrides a calibration's measured one."""
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
    if keep_rate is not None:
        values["keep_rate"], sources["keep_rate"] = keep_rate, "--keep-rate"
    values.setdefault("keep_rate", 1.0)
    for k in ("row_step_s", "prefill_token_s", "long_tail", "short_max"):
        sources.setdefault(k, "default")
    if layout.loop.dynamic_sampling:
        sources.setdefault("keep_rate", "default")
        notes.append(f"dynamic sampling: {values['keep_rate']:.0%} of the sampled groups kept "
                     f"({sources['keep_rate']}; each trained group costs 1 / keep rate generated groups)")
    if layout.loop.multi_turn:
        notes.append(f"multi-turn: tool calls assumed after {TOOL_CALL_P:.0%} of the model turns, "
                     f"{TOOL_LATENCY_S:g} s each (no run measures them yet)")
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
