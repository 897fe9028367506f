"""Peak memory of one trainer rank and one rollout replica GPU, from the config and the model's shape.

One function, `predict_memory`, with named terms in bytes (`validate --json` / `--explain` print them). Notation:
P parameters (P_e of them in routed experts, P_d = P − P_e), L layers, h hidden, I intermediate (dense MLP),
k·I_m routed intermediate per token (MoE), V vocabulary; b_c bytes of the trainer's compute dtype
(`trainer.precision`, else `model.dtype`), b_p of its parameters (4: fp32 master weights, unless
`trainer.fp32_master_weights = false`; `engine.config.precision`), b_r of the rollout's (`rollout.dtype`, else
`model.dtype`).

Trainer rank, `torch` backend (FSDP2 over W = trainer_dp ranks, one rank = plain torch):

    weights P·b_p/W   gradients P·b_p/W   optimizer (AdamW m, v) 2·P·b_p/W
    compute_copy      b_c < b_p: W = 1 → P·b_c (autocast's weight cache); W > 1 → 2 gathered layers in b_c
                      (current + prefetched) + the root unit (embeddings, and the output head when untied: V·h
                      each); b_c = b_p and W > 1 → the same in b_p
    gradients         sharded, resident from a rank's first micro-batch on: every micro-batch reduce-scatters
                      (`engine.trainer.fsdp`), so no unsharded P·4 accumulates
    reference         with `use_kl_loss`: P·b_c/W, 0 with `trainer.ref_param_offload`

`megatron` (tp, pp, cp, ep, etp; DP = W/(tp·pp·cp), expert DP = W/(ep·etp·pp)): the rank holds
S = (P_d/(tp·pp) + P_e/(ep·etp·pp))·w parameters (w = 1, or with uneven pipeline stages the fullest
stage's share against the even split, `engine.config.megatron_model.stage_memory_shares`) — weights S·b_c, fp32
main gradients S·4, the distributed optimizer's fp32 master + m + v 12·(P_d/(tp·pp)/(DP·cp) + P_e/(ep·etp·pp)/EDP)
(dense state sharded over Megatron's DP × CP group; in host memory with `trainer.optimizer_offload` on cuda), a
frozen reference S·b_c — with `ref_param_offload` on cuda in host memory, brought onto the device for its log-prob
pass: that moment, S·b_c + the pass's layer working set + its head, beyond the update's moment (activations,
transient, head, dispatch) is `reference_pass`, so the total is the resident terms plus the larger moment.

torch backend: the activation terms are `engine.plan.memory_torch`'s — the saved activations (per-layer
checkpoints T·L·h·b_res with recompute, exact) plus the largest moment of the step (the head chunk's forward
with the entropy metric or its backward, or one layer rebuilt in the backward); the terms below are Megatron's.

Activations of the update micro-batch, T tokens (`ppo_max_token_len_per_gpu` with `use_dynamic_bsz` — a bound on
the tokens the forward computes on: padded rows × longest row, `engine.trainer.minibatch.micro_batch_count`, or
with packed rows (`token_count`) the packed tokens, `engine.trainer.packed_rows.packed_cost` —, else
`ppo_micro_batch_size_per_gpu × (max_prompt_length + max_response_length)`), per rank T' = T/(cp·tp) (sequence
parallel) on Megatron, T on torch — with Ulysses SP s (`engine.plan.sequence_parallel`) an SP group's micro-batch
holds T·s tokens with `use_dynamic_bsz` (verl's per-group budget), T rows' tokens otherwise, and each rank
forwards T' = (group tokens)/s of them (DP = W/s; no padding mask: the rows are left-aligned and attention
is causal); its eager attention scores cover H/s heads of the full rows, H·T'·S as below:

    per-token, per-layer a = (c_h·h + c_i·I + c_m·k·I_m [MoE layers]) · b_c/2          (calibrated, bytes)
    log-prob pass   T_lp'·a (no-grad forward of the log-prob micro-batch, `log_prob_max_token_len_per_gpu`:
                    one layer's working set at a time); `activations` is the larger of it and the update's
    recompute off:  T'·L·a              (Megatron: L/pp layers × pp micro-batches in flight on stage 0 = L; uneven
                                        stages: max_s n_s·(pp − s) layers in place of L)
    recompute on:   T'·(⌈L/g⌉·c_ck·h·b_c/2 + g·a) — each group of g layers keeps its input, one group is
                    rebuilt at a time (g = 1 for `enable_gradient_checkpointing`; Megatron full/uniform:
                    `recompute_num_layers`)
    transient       c_t · (params of one layer) · b_c  (a weight gradient being accumulated)
    log-prob head   T_head·V/tp·c_v: T_head = min(`trainer.logprob_chunk_tokens`, the response tokens of
                    the micro-batch a rank holds, T/cp · max_response / (max_prompt + max_response)); the
                    Megatron head is chunked at cp > 1 too (`engine.trainer.megatron.head.owned_log_probs`)
    moe_dispatch    Megatron MoE: 2·T'·k·h·b_c (the token dispatcher's permuted input and output)
    attention_scores  torch backend with eager attention (`trainer.attn_implementation`, "auto" counted as eager
                    when the launch could choose it): the softmax's fp32 output and its b_c copy (b_c < 4) of
                    H heads × S² per row of S = max_prompt + max_response, B = T/S rows, for L layers (1 with
                    recompute): L·H·T·S·(4 + b_c) — counted from the kernel's saved tensors, not calibrated

c_h, c_i, c_m, c_ck, c_t, c_v (and c_tail, c_bwd: `engine.plan.memory_torch`) are measured, not guessed: `python -m benchmarks memory-model` runs real HF
Qwen2 / Qwen3-MoE slices at the presets' real widths on this CPU and writes `_calibration/activations.json`
(shipped with the package). Megatron's selective recompute is counted as no recompute (not measured: an upper
bound). Host-side terms (the π_prox snapshot in decoupled mode, P·b_p/W, pinned CPU memory; the weight-sync
bucket, gathered to host on rank 0) count toward the rank when the "GPU" is the CPU, else they are listed
under `host`. Accelerators add 2 GB of runtime (CUDA/CANN context, allocator fragmentation), CPU 0.3 GB.

Rollout replica, per GPU (TP · PP · DP GPUs, experts split EP ways; `engine.plan.rollout_replica`): weights
[(P_d − E)·q + E·b_r]/(TP·PP) + P_e·q/(S_e·PP) (q = b_r, or 1 + 4/128² bytes with `rollout.quantization =
"fp8"`), an activation reserve max(1 GB, 5 % of the budget), one incoming weight-sync bucket, and the KV cache
2·⌈L/PP⌉·⌈n_kv/TP⌉·d·b_r per token (MLA: ⌈L/PP⌉·(r_kv + d_r)·b_r) for `max_num_seqs` full-length sequences
(per data-parallel rank), capped by what the budget leaves (`gpu_memory_utilization` × memory for vLLM, 90 %
for the `hf` sampler).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.config.precision import policy_of
from engine.plan import rollout_replica as replica

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

GB = 1e9
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "auto": 4}
"""Bytes per element; "auto" (chosen by a measurement at launch, `engine.plan.auto`) counts as fp32, the larger
of its two outcomes, so a config that fits before the measurement fits after it."""
CALIBRATION = Path(__file__).parent / "_calibration" / "activations.json"
ACCEL_RUNTIME = 2.0 * GB
CPU_RUNTIME = 0.3 * GB


TERMS = {
    "weights": "this rank's parameters (torch: P·b_p/W, fp32 masters; megatron: the tp/pp/ep·etp shard in b_c)",
    "gradients": "gradients of those parameters (torch: P·b_p/W; megatron: fp32 main grads of the shard)",
    "optimizer": "AdamW m and v (torch: 2·P·b_p/W; megatron distributed optimizer: fp32 master + m + v over DP)",
    "compute_copy": "compute-dtype copies (1 rank: autocast's weight cache; FSDP2: 2 gathered layers + the root: "
                    "embeddings and an untied output head)",
    "reference": "the frozen KL reference in b_c (no gradients, no optimizer; host memory with ref_param_offload)",
    "activations": "saved activations of the update micro-batch (calibrated per token per layer, recompute-aware)"
                   ", or the log-prob pass's working set if larger",
    "backward_transient": "a weight gradient being accumulated in the backward (calibrated, per layer)",
    "logprob_head": "the log-prob head over min(logprob_chunk_tokens, response tokens) × V/tp: fp32 log-softmax "
                    "and its gradient (torch: the larger of the chunk's forward with the entropy metric and its "
                    "backward with the head's weight gradient)",
    "activation_tail": "the final norm's saved tensors and the head's input (c_tail; torch), until the head's backward",
    "layer_rebuild": "one decoder layer's activations rebuilt in the backward (recompute; torch's peak moment)",
    "head_gradient": "the output head's unsharded weight gradient in the compute dtype (torch, until the root's "
                     "reduce-scatter)",
    "moe_dispatch": "Megatron MoE token dispatcher: permuted input and output, 2·T'·k·h·b_c",
    "reference_pass": "megatron with ref_param_offload (cuda): the reference's weights on the device for its "
                      "log-prob pass (+ that pass's layer working set and head), beyond the update's moment",
    "attention_scores": "eager attention: the softmax probabilities (fp32 and compute dtype) of every layer, H·T·S per layer",
    "prox_snapshot": "the version's weights θ_v, a snapshot of this rank's parameters (π_prox in decoupled mode; "
                     "deterministic mode keeps it for an exact resume between syncs; pinned host memory)",
    "weight_sync_bucket": "one weight-sync bucket (rollout.weight_sync_bucket_mb)",
    "weight_sync_back_buffer": "a second copy of the replica's weights (rollout.weight_sync_back_buffer = \"on\")",
    "runtime": "CUDA/CANN context and allocator fragmentation (2 GB; 0.3 GB on CPU)",
    "activation_reserve": "vLLM's activation reserve: max(1 GB, 5 % of the budget)",
    "kv_cache": "KV cache: 2·L·⌈n_kv/TP⌉·d·b_r per token, max_num_seqs full-length sequences, capped by the budget",
}
ROLLOUT_TERMS = {**TERMS, "weights": "the replica's weights on this GPU: dense/(TP·PP) + experts/(EP·PP), in "
                                     "rollout.dtype or fp8 (rollout.quantization)"}
"""What each named term is (`validate --explain` prints it beside the number); the rollout's variant."""


class ModelShape(Protocol):
    """What the memory model reads of a model (the CLI's model facts from config.json have it)."""

    params_total: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int
    experts_per_token: int
    moe_intermediate: int
    moe_layers: int

    @property
    def is_moe(self) -> bool: ...

    @property
    def params_expert(self) -> int: ...


@dataclass
class RoleMemory:
    """Predicted peak of one trainer rank or one rollout replica GPU: named terms (bytes), their total, the
    capacity, and host-side terms that do not count toward the device (accelerators only)."""

    role: str
    terms: dict[str, float]
    capacity: float
    fits: bool
    host: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())


@dataclass
class MemoryPrediction:
    trainer: RoleMemory
    rollout: RoleMemory


@cache
def calibration(path: str | None = None) -> dict[str, Any]:
    """The measured coefficients (see the module docstring), from the shipped table or `path`."""
    return json.loads(Path(path or CALIBRATION).read_text())


def layer_params(m: ModelShape) -> int:
    """Parameters of one decoder layer (all its experts included)."""
    attn = m.hidden * m.heads * m.head_dim * 2 + 2 * m.hidden * m.kv_heads * m.head_dim
    mlp = 3 * m.hidden * (m.experts * m.moe_intermediate if m.is_moe else m.intermediate)
    return attn + mlp


def activation_per_token_layer(m: ModelShape, compute_bytes: int, cal: dict[str, Any]) -> float:
    """a of the module docstring: saved activations per token and layer, averaged over dense and MoE layers."""
    c = cal["coefficients"]
    moe_share = (m.moe_layers or m.layers) / m.layers if m.is_moe else 0.0
    mlp = (moe_share * c["c_m"] * m.experts_per_token * m.moe_intermediate
           + (1 - moe_share) * c["c_i"] * m.intermediate)
    return (c["c_h"] * m.hidden + mlp) * compute_bytes / 2


def activation_bytes(m: ModelShape, tokens: float, layers: int, recompute: bool, compute_bytes: int,
                     cal: dict[str, Any], group: int = 1) -> float:
    """Activations of `tokens` tokens through `layers` layers, with or without recompute in groups of `group`
    layers (each group keeps its input; one group is rebuilt at a time)."""
    a = activation_per_token_layer(m, compute_bytes, cal)
    if recompute:
        groups = -(-layers // group)
        return tokens * (groups * cal["coefficients"]["c_ck"] * m.hidden * compute_bytes / 2 + min(group, layers) * a)
    return tokens * layers * a


def transient_bytes(m: ModelShape, compute_bytes: int, cal: dict[str, Any]) -> float:
    """A weight gradient being accumulated during the backward."""
    return cal["coefficients"]["c_t"] * layer_params(m) * compute_bytes


def head_bytes(tokens: float, vocab: int, cal: dict[str, Any]) -> float:
    """The log-prob head (fp32 log-softmax and its gradient) over `tokens` tokens."""
    return tokens * vocab * cal["coefficients"]["c_v"]


def eager_attention(cfg: RunConfig, seq: int) -> bool:
    """The torch trainer runs eager attention: `trainer.attn_implementation = "eager"`, or "auto" at rows short
    enough for the launch to measure it (`engine.plan.auto.ATTN_MAX_POSITIONS`: counted as the larger outcome)."""
    from engine.plan.auto import ATTN_MAX_POSITIONS, trainer_positions

    impl = cfg.trainer.attn_implementation
    return impl == "eager" or (impl == "auto" and trainer_positions(cfg) <= ATTN_MAX_POSITIONS)


def _bytes(name: str | None, default: int) -> int:
    return DTYPE_BYTES.get(str(name), default) if name else default


def update_tokens(cfg: RunConfig) -> int:
    """T: tokens of one update micro-batch on one rank."""
    t, d = cfg.trainer, cfg.data
    if t.use_dynamic_bsz:
        return int(t.ppo_max_token_len_per_gpu)
    return int(t.ppo_micro_batch_size_per_gpu * (d.max_prompt_length + d.max_response_length))


def log_prob_tokens(cfg: RunConfig) -> int:
    """Tokens of one log-prob (π_old, π_prox, reference) micro-batch on one rank."""
    t, d = cfg.trainer, cfg.data
    if t.use_dynamic_bsz:
        return int(t.log_prob_max_token_len_per_gpu or t.ppo_max_token_len_per_gpu)
    return int(t.ppo_micro_batch_size_per_gpu * (d.max_prompt_length + d.max_response_length))


# --- packed rows (`trainer.use_remove_padding`, `engine.trainer.packed_rows`) ---------------------------------
def token_count(cfg: RunConfig) -> str:
    """What T counts: "packed" — the torch / FSDP2 trainer forwards text rows without padding, so activation tokens
    are real tokens (plus, on the masked layout, the first-fit slack that the budget counts too) — else "padded"
    (rows × longest row). Either way T bounds the tokens the forward holds activations for, so no term changes
    by a factor: packing lets the same T hold more rows (fewer micro-batches per update), not more tokens."""
    t = cfg.trainer
    packs = t.backend != "megatron" and t.use_remove_padding and cfg.data.image_key is None
    return "packed" if packs else "padded"


def trainer_memory(cfg: RunConfig, m: ModelShape, world: int, capacity: float, device: str,
                   cal: dict[str, Any] | None = None) -> RoleMemory:
    """One trainer rank's predicted peak (module docstring); `world` = trainer ranks."""
    cal = cal or calibration()
    t, d = cfg.trainer, cfg.data
    policy = policy_of(cfg)
    b_c, b_p = DTYPE_BYTES[policy.compute], DTYPE_BYTES[policy.params]
    p = m.params_total
    terms: dict[str, float] = {}
    host: dict[str, float] = {}
    tokens = update_tokens(cfg)
    if t.backend == "megatron":
        etp = t.etp
        p_e = m.params_expert
        from engine.config.megatron_model import stage_memory_shares

        # the fullest pipeline stage (uneven stages: trainer.num_layers_in_first/last_pipeline_stage)
        stage_w, in_flight = stage_memory_shares(m.layers, t.pp, t.num_layers_in_first_pipeline_stage,
                                                 t.num_layers_in_last_pipeline_stage)
        dense, expert = (p - p_e) / (t.tp * t.pp) * stage_w, p_e / (t.ep * etp * t.pp) * stage_w
        dp, edp = max(1, world // (t.tp * t.pp * t.cp)), max(1, world // (t.ep * etp * t.pp))
        terms["weights"] = (dense + expert) * b_c
        terms["gradients"] = (dense + expert) * 4
        # with trainer.optimizer_offload (cuda) the fp32 masters and Adam state live in host memory
        # the distributed optimizer shards dense parameters over DP × CP (Megatron's intra-DP-CP group: a CP rank
        # holds the same dense parameters as its DP peers) and expert parameters over expert DP
        (host if t.optimizer_offload and device == "cuda" else terms)["optimizer"] = \
            12 * (dense / (dp * t.cp) + expert / edp)
        if t.use_kl_loss:
            (host if t.ref_param_offload else terms)["reference"] = (dense + expert) * b_c
        shard_tokens, tp, dp_share = tokens / (t.cp * t.tp), t.tp, dp
        recompute = t.recompute_granularity == "full"
        group = t.recompute_num_layers if t.recompute_method == "uniform" else 1
        if m.is_moe:
            terms["moe_dispatch"] = 2 * shard_tokens * m.experts_per_token * m.hidden * b_c
    else:
        terms["weights"] = p * b_p / world
        terms["gradients"] = p * b_p / world
        terms["optimizer"] = 2 * p * b_p / world
        root = m.vocab * m.hidden * (1 if getattr(m, "tied", True) else 2)  # embeddings (+ an untied head)
        if b_c < b_p:
            terms["compute_copy"] = p * b_c if world == 1 else (2 * layer_params(m) + root) * b_c
        elif world > 1:
            terms["compute_copy"] = (2 * layer_params(m) + root) * b_p
        if t.use_kl_loss:
            (host if t.ref_param_offload else terms)["reference"] = p * b_c / world
        sp = t.ulysses_sequence_parallel_size if world % t.ulysses_sequence_parallel_size == 0 else 1
        tokens = tokens * sp if t.use_dynamic_bsz else tokens  # an SP group's micro-batch (verl's budget × s)
        shard_tokens, tp, dp_share = tokens / sp, 1, world // sp
        recompute, group = t.enable_gradient_checkpointing, 1
    seq = d.max_prompt_length + d.max_response_length
    # the no-grad log-prob passes keep one layer's working set of their (larger) micro-batch at a time
    lp_tokens = log_prob_tokens(cfg) * shard_tokens / max(tokens, 1)  # split as the update's (cp·tp)
    response_tokens = shard_tokens * tp * d.max_response_length / seq
    moment: dict[str, Any] = {}
    if t.backend == "megatron":
        update_act = activation_bytes(m, shard_tokens, in_flight, recompute, b_c, cal, group)
        lp_act = activation_per_token_layer(m, b_c, cal) * lp_tokens
        terms["activations"] = max(update_act, lp_act)
        terms["backward_transient"] = transient_bytes(m, b_c, cal)
        terms["logprob_head"] = head_bytes(min(t.logprob_chunk_tokens, response_tokens), m.vocab // tp, cal)
        moment["activations_from"] = "update" if update_act >= lp_act else "log-prob pass"
        if t.use_kl_loss and t.ref_param_offload and device == "cuda":
            # the offloaded reference comes onto the device for its log-prob pass, next to the policy's resident
            # weights, gradients and optimizer state: that moment (its weights, the pass's layer working set and
            # head) against the update's (activations, transient, head, dispatch); the larger sets the peak
            lp_head = head_bytes(min(t.logprob_chunk_tokens, lp_tokens * tp * d.max_response_length / seq),
                                 m.vocab // tp, cal)
            ref_moment = (dense + expert) * b_c + lp_act + lp_head
            update_moment = sum(terms[k] for k in ("activations", "backward_transient", "logprob_head",
                                                   "moe_dispatch") if k in terms)
            terms["reference_pass"] = max(0.0, ref_moment - update_moment)
            moment["reference_pass_gb"] = round(ref_moment / GB, 2)
            moment["update_moment_gb"] = round(update_moment / GB, 2)
    else:  # the update's saved activations and its largest moment (`engine.plan.memory_torch`)
        from engine.plan.memory_torch import torch_activation_terms

        rc = cfg.algorithm.rollout_correction
        act, moment = torch_activation_terms(
            m, tokens=shard_tokens, head_tokens=min(t.logprob_chunk_tokens, response_tokens), lp_tokens=lp_tokens,
            lp_head_tokens=min(t.logprob_chunk_tokens, lp_tokens * d.max_response_length / seq),
            recompute=recompute, b_c=b_c, b_res=b_p if world == 1 else b_c,
            vision=getattr(m, "params_vision", 0) > 0, log_prob_passes=int(not rc.bypass_mode) + int(t.use_kl_loss),
            cal=cal)
        terms.update(act)
    if t.backend != "megatron" and eager_attention(cfg, seq):
        held = 1 if recompute else m.layers
        terms["attention_scores"] = held * m.heads * shard_tokens * seq * (4 + (b_c if b_c < 4 else 0))
    if not cfg.algorithm.rollout_correction.bypass_mode or t.deterministic:  # θ_v: π_prox, the exact resume
        host["prox_snapshot"] = terms["weights"] * (b_p / b_c if t.backend == "megatron" else 1)
    host["weight_sync_bucket"] = cfg.rollout.weight_sync_bucket_mb * 2**20
    on_cpu = device == "cpu"
    if on_cpu:  # host memory is the device's memory
        terms.update(host)
        host = {}
    terms["runtime"] = CPU_RUNTIME if on_cpu else ACCEL_RUNTIME
    total = sum(terms.values())
    return RoleMemory("trainer", terms, capacity, total <= capacity, host, {
        "tokens_per_micro_batch": tokens, "token_count": token_count(cfg), "tokens_per_rank": round(shard_tokens), "world": world,
        "log_prob_tokens_per_micro_batch": log_prob_tokens(cfg),
        **moment,
        "data_parallel": dp_share, "recompute": recompute, "compute_bytes": b_c, "param_bytes": b_p,
        "use_dynamic_bsz": t.use_dynamic_bsz, "precision": policy.describe(),
        "calibration": cal.get("source", str(CALIBRATION.name))})


def rollout_memory(cfg: RunConfig, m: ModelShape, memory: float, device: str) -> RoleMemory:
    """One rollout replica GPU's weights, activation reserve, incoming bucket and KV cache within its budget."""
    r, d = cfg.rollout, cfg.data
    b_r = _bytes(r.dtype, _bytes(cfg.model.dtype, 4))
    tp = r.tensor_parallel_size
    budget = memory * (r.gpu_memory_utilization if r.backend == "vllm" else 0.9)
    weights = replica.weights_per_gpu(cfg, m)  # TP·PP·EP split, the dtype's bytes (fp8 + block scales)
    reserve = max(1 * GB, 0.05 * budget)
    bucket = r.weight_sync_bucket_mb * 2**20
    kv_tok = replica.kv_bytes_per_token(cfg, m)
    seq = d.max_prompt_length + d.max_response_length
    # a staged sync's back buffer (engine.sync.staging): counted when forced on; "auto" allocates it only where
    # the memory is free at run time
    back = weights if r.backend == "hf" and r.weight_sync_back_buffer == "on" else 0.0
    kv_free = budget - weights - reserve - bucket - back
    seqs_full = int(kv_free // (kv_tok * seq)) if kv_free > 0 else 0
    kv_needed = r.max_num_seqs * kv_tok * seq
    terms = {"weights": weights, "activation_reserve": reserve, "weight_sync_bucket": bucket,
             **({"weight_sync_back_buffer": back} if back else {}),
             "kv_cache": min(kv_needed, max(kv_free, 0.0))}
    return RoleMemory("rollout", terms, budget, kv_free > 0 and seqs_full >= 1, {}, {
        "kv_bytes_per_token": kv_tok, "max_sequence_tokens": seq, "kv_gb_for_max_num_seqs": round(kv_needed / GB, 2),
        "kv_gb_available": round(max(kv_free, 0.0) / GB, 2), "seqs_at_full_length": seqs_full,
        "max_num_seqs": r.max_num_seqs, "tensor_parallel_size": tp, "rollout_bytes": b_r,
        "replica_gpus": replica.replica_gpus(cfg), "replica": replica.describe(cfg),
        "quantization": r.quantization,
        "memory_gb": memory / GB, "device": device})


def export_bytes(cfg: RunConfig) -> int:
    """b_r: bytes per parameter of the weight export — the replicas' dtype (`rollout.dtype`, else `model.dtype`),
    which both backends cast to before a tensor is bucketed (`engine.runtime.backends.rollout_dtype`)."""
    return _bytes(cfg.rollout.dtype, _bytes(cfg.model.dtype, 4))


def sync_bytes(params_total: float, param_bytes: float, embed: float = 0.0, quantization: str | None = None
               ) -> float:
    """Bytes one weight sync moves to every replica: each parameter once, in the export dtype, B = P·b_r
    (Qwen3-VL-8B in bf16: 8.77·10⁹ × 2 = 17.5 GB); with `rollout.quantization = "fp8"` the sender's blockwise
    fp8 (`engine.sync.fp8`), B = (P − E)·(1 + 4/128²) + E·b_r, `embed` = E the embedding and LM head, which stay
    in b_r (DeepSeek-V3: 0.68 TB instead of 1.34 TB). `asyncrl plan`'s sync term (`engine.predict.costs`),
    `engine.plan.rollout_replica.sync_bytes` and `asyncrl rehearse`'s check of the bytes the export really yields
    use this one formula."""
    if quantization == "fp8":
        e = min(float(embed), float(params_total))
        return (float(params_total) - e) * replica.FP8_BYTES + e * param_bytes
    return float(params_total) * param_bytes


def checkpoint_bytes(cfg: RunConfig, m: ModelShape) -> float:
    """One checkpoint's size on disk: the trainer's save (its JSON files are small beside it). torch: the
    weights and AdamW's m and v in the parameters' dtype, 3·P·b_p (the tiny model: 5.95 MB predicted, 6.0 MB
    written); megatron: the weights in b_c and the distributed optimizer's fp32 master + m + v, P·(b_c + 12).
    A run's checkpoint directory needs (keep_last + 1) of them: a new one is complete before the oldest goes."""
    policy = policy_of(cfg)
    p = m.params_total
    if cfg.trainer.backend == "megatron":
        return p * (DTYPE_BYTES[policy.compute] + 12)
    return 3 * p * DTYPE_BYTES[policy.params]


def predict_memory(cfg: RunConfig, m: ModelShape, *, trainer_world: int, memory_gb: float, device: str,
                   cal: dict[str, Any] | None = None) -> MemoryPrediction:
    """Each trainer rank's and each rollout replica GPU's predicted peak (bytes, named terms) for `cfg` on
    devices of `memory_gb` GB (`device` "cpu" counts host-side terms on the device)."""
    return MemoryPrediction(trainer_memory(cfg, m, trainer_world, memory_gb * GB, device, cal),
                            rollout_memory(cfg, m, memory_gb * GB, device))
