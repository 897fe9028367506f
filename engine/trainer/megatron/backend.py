"""`MegatronTrainerBackend`: the `TrainerBackend` protocol on Megatron-core (`trainer.backend = "megatron"`).

One instance per trainer process (rank). The world is TP × PP × DP (× EP inside DP); every rank of a DP
replica (its TP group at every pipeline stage) must be given the same batch, and each DP rank its own rows
(as with the torch backend). With PP > 1 the forward/backward passes run through Megatron's pipeline
schedule (`pipeline.py`): log-probs are computed on the last stage and broadcast to the replica's other
stages, and so are the loss metrics. Per call:

* log-probs: `pack_batch` (left padding removed, so Megatron's RoPE positions equal HF's), a GPTModel
  forward giving vocab-parallel logits, then `vocab_parallel_log_probs` at the rollout temperature.
* `train_step`: one local step, `mini_batches × ppo_epochs` optimizer updates on the mini-batches of
  `engine.trainer.minibatch.mini_batch_plan` (verl's actor loop; an empty share of a mini-batch steps with
  weight 0). Each update: micro-batches b_k of `micro_batch_size` rows with mass m_k (`batch.meta["micro_weight_fn"]`,
  default the response-token count) and loss L_k; each rank backpropagates (m_k / Σ_all ranks m) · dp · L_k
  and Megatron DDP averages over DP, so the update follows ∇ Σ_k (m_k / Σm) L_k over the global batch.
  `finalize_model_grads` then reduces DP grads and sums the TP-replicated norm grads (q/k-norm, sequence
  parallel); AdamW on `main_grad` (CPU) or Megatron's distributed optimizer (GPU) steps with clipping.
  Every rank runs the same number of micro-batches (shorter ranks repeat their last one with weight 0 and a
  zero loss that still backpropagates, so no loss function observes a row twice), so the TP / expert-parallel
  collectives line up. A `FILLER` shard (a DP rank without rows of its own, `engine.trainer.batch.shard_rows`)
  is stepped through the same way with mass 0 and contributes nothing: no log-probs, tokens or metrics.
* the proximal snapshot (`snapshot.py`) and checkpoints (`checkpointing.py`) as documented there.
* precision (`engine.config.precision`): parameters in the compute `dtype`; with `fp32_master_weights` the
  gradients accumulate and reduce in fp32 (`grad_reduce_in_fp32`) and the optimizer updates fp32 main params
  (Megatron's own on GPU, `MainGradAdamW`'s on CPU). Activation recompute: `recompute_granularity` /
  `recompute_method` / `recompute_num_layers` as Megatron's `TransformerConfig`; expert-TP `etp`.
* `frozen = True`: the KL loss's reference — the GPTModel without DDP wrapper, gradient buffers, optimizer
  or snapshot, `requires_grad = False`, `compute_log_probs` only (weights in host memory between calls with
  `param_offload`, on GPU).
* `hf_weights`: a `TensorGetter` of the HF weights in place of the directory's safetensors (`asyncrl rehearse`
  hands it fake tensors of the real shapes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
import torch.distributed as dist

from engine.trainer.base import LossFn, TrainBatch
from engine.trainer.batch import FILLER, is_filler, lockstep_log_probs, plan_micro_batches, trim_padding
from engine.config.megatron_model import MegatronModelConfig
from engine.trainer.megatron import checkpointing as mckpt
from engine.trainer.megatron import context_parallel, moe_aux, pipeline
from engine.trainer.megatron.convert import (
    SafetensorsSource,
    TensorGetter,
    load_hf_into,
    state_dict_getter,
)
from engine.trainer.megatron.export import current_shard_info, export_hf, iter_hf_tensors
from engine.trainer.megatron.hf_config import load_arch
from engine.trainer.megatron.inputs import pack_batch
from engine.trainer.megatron.model import build_gpt_model, recompute_settings
from engine.trainer.megatron.optim import MainGradAdamW, MegatronDistOptimizer, build_update, optim_settings
from engine.trainer.process_groups import all_reduce_values
from engine.trainer.megatron.parallel import ParallelLayout, init_model_parallel, init_process_group
from engine.trainer.megatron.shims import apply_cpu_shims, seed_model_parallel_rng
from engine.trainer.megatron.snapshot import ParamSnapshot, VersionWeights, snapshot_targets
from engine.trainer.megatron.update import optimizer_update, token_mass  # noqa: F401 - token_mass: API
from engine.trainer.megatron.head import chunked_log_probs
from engine.trainer.minibatch import local_step_metrics, mini_batch_plan
from engine.trainer.optim import OptimConfig, WarmupSchedule

log = logging.getLogger(__name__)

EntropyMode = Literal["none", "metric", "grad"]
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _resolve_dtype(dtype: str | torch.dtype | None, on_gpu: bool) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if on_gpu else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported (float32 | bfloat16)")
    return _DTYPES[dtype]


class MegatronTrainerBackend(VersionWeights, WarmupSchedule):
    """Policy weights + optimizer of one Megatron trainer rank (see the module docstring)."""

    def __init__(
        self,
        hf_model_dir: str,
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
        optim_cfg: Mapping[str, Any] | OptimConfig | None = None,
        grad_clip: float = 1.0,
        micro_batch_size: int = 8,
        temperature: float = 1.0,
        rank: int | None = None,
        world_size: int | None = None,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        dtype: str | torch.dtype | None = None,
        seed: int = 0,
        entropy: EntropyMode = "metric",
        mini_batches: int = 1,
        ppo_epochs: int = 1,
        shuffle: bool = False,
        etp: int = 1,
        fp32_master_weights: bool = True,
        recompute_granularity: str | None = None,
        recompute_method: str = "uniform",
        recompute_num_layers: int = 1,
        logprob_chunk_tokens: int | None = None,
        frozen: bool = False,
        param_offload: bool = False,
        use_dynamic_bsz: bool = False,
        ppo_max_token_len_per_gpu: int = 16384,
        log_prob_max_token_len_per_gpu: int | None = None,
        device: str | None = None,
        hf_weights: TensorGetter | None = None,
        perf: Mapping[str, Any] | None = None,
        **model_settings: Any,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError("micro_batch_size must be >= 1")
        if mini_batches < 1 or ppo_epochs < 1:
            raise ValueError("mini_batches and ppo_epochs must be >= 1")
        self.mini_batches, self.ppo_epochs, self.shuffle, self.seed = int(mini_batches), int(ppo_epochs), \
            bool(shuffle), int(seed)
        if temperature <= 0:
            raise ValueError("temperature must be > 0 (log-probs are taken at the rollout temperature)")
        # the run plan's trainer device; constructed directly (tests, benchmarks) without one: CUDA when usable
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device not in ("cuda", "cpu"):
            raise ValueError(f'trainer.backend = "megatron" runs on CUDA or CPU, not {device!r}; use the torch '
                             "(FSDP2) trainer on this hardware")
        self.on_gpu = device == "cuda"
        apply_cpu_shims()
        self.hf_model_dir = str(hf_model_dir)
        self.arch = load_arch(hf_model_dir)
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
        unknown = set(model_settings) - set(MegatronModelConfig.model_fields)
        if unknown:
            raise TypeError(f"unknown Megatron model settings: {', '.join(sorted(unknown))}")
        self.layout = ParallelLayout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, world_size=world_size,
                                     first_stage_layers=model_settings.get("num_layers_in_first_pipeline_stage"),
                                     last_stage_layers=model_settings.get("num_layers_in_last_pipeline_stage"))
        self.layout.validate(on_gpu=self.on_gpu, num_experts=self.arch.num_experts,
                             num_layers=self.arch.num_layers, num_query_groups=self.arch.num_query_groups)
        if master_port is None:
            env_port = os.environ.get("MASTER_PORT")
            if env_port is None and world_size > 1:
                raise ValueError("world_size > 1 needs master_port (or MASTER_PORT) shared by all ranks")
            master_port = int(env_port) if env_port else free_port()
        init_process_group(rank, world_size, master_addr, master_port, device)
        init_model_parallel(self.layout)
        self.rank = rank
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        self.dtype = _resolve_dtype(dtype, self.on_gpu)
        self.micro_batch_size = int(micro_batch_size)
        # token budgets (`use_dynamic_bsz`): None = fixed micro_batch_size rows per micro-batch
        self.update_budget = int(ppo_max_token_len_per_gpu) if use_dynamic_bsz else None
        self.log_prob_budget = int(log_prob_max_token_len_per_gpu or ppo_max_token_len_per_gpu) \
            if use_dynamic_bsz else None
        self.temperature = float(temperature)
        self.grad_clip = float(grad_clip)
        self.entropy_mode: EntropyMode = entropy
        self.optim_settings = optim_settings(optim_cfg)
        self.base_lr, self.warmup_steps = self.optim_settings.lr, self.optim_settings.warmup_steps
        self.global_step = 0
        self.extra_metrics: dict[str, float] = {}

        # Megatron's init draws from the global RNGs; fork them so building a backend leaves the caller's
        # random streams untouched (the weights are overwritten from the checkpoint anyway).
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if self.on_gpu else []):
            torch.manual_seed(seed)
            seed_model_parallel_rng(seed)
            self.model = build_gpt_model(self.arch, self.layout, self.dtype, self.on_gpu,
                                         None if frozen else recompute_settings(
                                             recompute_granularity, recompute_method, recompute_num_layers),
                                         (perf or {}).get("moe_token_dispatcher_type"), model_settings,
                                         flash=(perf or {}).get("attention") == "flash")
        self.aux_losses = self.arch.is_moe and not frozen and (
            model_settings.get("moe_z_loss_coeff") is not None or (
                float(model_settings.get("moe_aux_loss_coeff") or 0.0) > 0
                and model_settings.get("moe_router_load_balancing_type", "none") != "none"))
        if self.aux_losses:
            moe_aux.install()
        self.load_hf_weights(hf_weights or SafetensorsSource(hf_model_dir))
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.frozen, self.param_offload = bool(frozen), bool(param_offload) and self.on_gpu
        self.optimizer: MainGradAdamW | MegatronDistOptimizer | None = None
        if frozen:  # the reference: no DDP wrapper, no gradient buffers, no optimizer, no snapshot
            self.model.requires_grad_(False)
            self.ddp = self.model
            if self.param_offload:
                self.model.cpu()
            return
        self.ddp, self.optimizer = build_update(self.model, self.layout, self.on_gpu, self.optim_settings,
                                                self.grad_clip, self.dtype, fp32_master_weights, perf)
        self.snapshot = ParamSnapshot(snapshot_targets(self.ddp))

    # --- construction ----------------------------------------------------------------------------------
    def load_hf_weights(self, source: TensorGetter | Mapping[str, torch.Tensor]) -> None:
        """Copy HF weights (a tensor getter, e.g. `SafetensorsSource`, or an HF state dict) into this rank."""
        get = state_dict_getter(source) if isinstance(source, Mapping) else source
        load_hf_into(dict(self.model.named_parameters()), get, self.arch, current_shard_info())

    # --- collectives over ranks ------------------------------------------------------------------------
    def _dp_group(self) -> Any:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_group()

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index: the ranks of one DP replica (its TP/CP peers) share it and must be
        given the same rows."""
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _sum_over_dp(self, values: list[float]) -> list[float]:
        if self.dp_size == 1 or not values:
            return values
        return all_reduce_values(values, self.device, group=self._dp_group())

    def _names_over_dp(self, sums: dict[str, float]) -> list[str]:
        """The metric names of every DP rank (a filler rank has none of its own), sorted, so the reduction
        below sums the same vector everywhere."""
        names = set(sums)
        if self.dp_size > 1:
            everyone: list[Any] = [None] * self.dp_size
            dist.all_gather_object(everyone, sorted(names), group=self._dp_group())
            names = set().union(*everyone)
        return sorted(names)

    def _max_over_world(self, value: int) -> int:
        if dist.get_world_size() == 1:
            return value
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    @property
    def _uniform_shapes(self) -> bool:
        """Megatron's all-gather MoE dispatcher (used on CPU) needs the same [B, S] on every EP rank."""
        return self.layout.ep > 1 and not self.on_gpu

    def _max_shape_over_world(self, shape: tuple[int, int]) -> tuple[int, int]:
        t = torch.tensor(shape, dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0]), int(t[1])

    def barrier(self) -> None:
        if dist.get_world_size() > 1:
            dist.barrier()

    # --- forward ---------------------------------------------------------------------------------------
    def _to_device(self, batch: TrainBatch) -> TrainBatch:
        return batch.to(self.device)

    def _forward(self, micro: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π(responses) [b, r] (fp32, differentiable) and entropy, for a trimmed micro-batch."""
        cp = self.layout.cp
        inp = pack_batch(micro, multiple_of=self.layout.tp * (2 * cp if cp > 1 else 1))
        rows = inp.shape[0]
        if self._uniform_shapes:
            inp = inp.pad_to(*self._max_shape_over_world(inp.shape))
        inp = inp.to(self.device)
        if cp > 1:  # CUDA + Transformer Engine only
            return context_parallel.forward_log_probs(self, inp, micro.responses.to(self.device), with_entropy, rows)
        logits = self.ddp(inp.tokens, inp.position_ids, inp.attention_mask, **self._router_mask(inp))[:rows]
        inp.response_index = inp.response_index[:rows]
        return self.head_log_probs(logits, inp.response_index, micro.responses.to(self.device), with_entropy)

    def _router_mask(self, inp: Any) -> dict[str, torch.Tensor]:
        """`padding_mask` (True = padding) for the MoE router's auxiliary losses, so padding tokens count in
        neither (verl's packed rows have none); with pp > 1 and tp > 1 Megatron does not split it for the later
        stages, so there the padding tokens count."""
        if not self.aux_losses or (self.layout.pp > 1 and self.layout.tp > 1):
            return {}
        return {"padding_mask": ~inp.valid}

    def head_log_probs(self, logits: torch.Tensor, response_index: torch.Tensor, responses: torch.Tensor,
                       with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π (and H) of `responses` [b, R] from vocab-parallel `logits` [b, S, V/tp] at `response_index`,
        `logprob_chunk_tokens` positions at a time (`engine.trainer.megatron.head.chunked_log_probs`)."""
        return chunked_log_probs(logits, response_index, responses, temperature=self.temperature,
                                 vocab_size=self.arch.vocab_size, chunk_tokens=self.logprob_chunk_tokens,
                                 with_entropy=with_entropy)

    def compute_log_probs(self, batch: TrainBatch, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π_θ(response token) [B, R] in fp32 on CPU at the trainer temperature (0 on padding)."""
        self.ddp.eval()
        if self.param_offload:
            self.model.to(self.device)
        try:
            with torch.no_grad() if self.frozen else contextlib.nullcontext():
                return self._compute_log_probs(batch, with_entropy)
        finally:
            if self.param_offload:
                self.model.cpu()

    def _compute_log_probs(self, batch: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.layout.pp > 1:
            return pipeline.compute_log_probs(self, batch, with_entropy)
        micros, order = plan_micro_batches(batch, self.micro_batch_size, self.log_prob_budget, self._max_over_world)

        def forward(k: int) -> tuple[torch.Tensor, torch.Tensor | None, int]:
            micro, width = trim_padding(micros[min(k, len(micros) - 1)])
            return (*self._forward(micro, with_entropy), width)

        return lockstep_log_probs(forward, self._max_over_world(len(micros)), len(micros), batch.response_mask,
                                  with_entropy, filler=is_filler(batch), order=order)

    # --- update ----------------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One local step: `mini_batches × ppo_epochs` optimizer updates (see the module docstring)."""
        if self.optimizer is None:
            raise RuntimeError("a frozen reference model does not train")
        start = time.perf_counter()
        plan = mini_batch_plan(len(batch), self.mini_batches, self.ppo_epochs, shuffle=self.shuffle,
                               seed=self.seed, step=self.global_step)
        updates: list[dict[str, float]] = []
        applied = 0
        for epoch, minis in enumerate(plan):
            for idx in minis:
                # an empty share: the first row, run with weight 0 (every rank steps together)
                mini = batch.select(torch.tensor(idx or [0], dtype=torch.long))
                mini.meta["ppo_epoch"], mini.meta["fresh"] = epoch, applied == 0
                if not idx:
                    mini.meta[FILLER] = True
                updates.append(self._update(mini, loss_fn, real=bool(idx)))
                applied += int(not updates[-1]["actor/skipped_step"])
        own = 0.0 if is_filler(batch) else float(batch.response_mask.sum())
        out = local_step_metrics(updates, self._sum_over_dp([own])[0], self.global_step,
                                 time.perf_counter() - start, self.extra_metrics)
        self.extra_metrics = {}
        return out

    def _update(self, batch: TrainBatch, loss_fn: LossFn, real: bool = True) -> dict[str, float]:
        """One optimizer update over the mini-batch `batch` (`update.optimizer_update`); `real=False`: this rank
        only joins the collectives, with weight 0."""
        return optimizer_update(self, batch, loss_fn, real)

    # --- the version's weights: π_prox and the resume's snapshot (`snapshot.py`) --------------------------
    def snapshot_params(self) -> None:
        """Copy every parameter (dense and expert-parallel DDP buffers) to host memory (pinned on GPU hosts)."""
        seconds = self.snapshot.take()
        log.debug("snapshot v%d: %.1f MiB in %.4fs", self.snapshot.version, self.snapshot.nbytes / 2**20, seconds)

    def proximal_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """log π_prox [B, R]: swap the snapshot in, compute, swap the live weights back bit-exactly.
        The swap and forward times appear in the next `train_step`'s metrics."""
        start = time.perf_counter()
        with self.snapshot.swapped_in():
            log_probs, _ = self.compute_log_probs(batch)
        stats = self.snapshot.stats
        self.extra_metrics["timing_s/prox_swap"] = stats.get("swap_in_s", 0.0) + stats.get("swap_back_s", 0.0)
        self.extra_metrics["timing_s/prox_log_probs"] = time.perf_counter() - start
        self.extra_metrics["asyncrl/prox_snapshot_bytes"] = float(self.snapshot.nbytes)
        return log_probs

    # --- weights out -----------------------------------------------------------------------------------
    def export_weights(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """HF-named tensor buckets in the model's dtype (tied `lm_head.weight` included). Every rank must iterate it (the gathers
        are collective); only rank 0 yields buckets."""
        for bucket in export_hf(self.model, self.arch, bucket_bytes):
            if self.is_main:
                yield bucket

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF-named weights on CPU (collective; every rank gets them)."""
        return {name: t.detach().cpu().clone() for name, t in iter_hf_tensors(self.model, self.arch)}

    # --- checkpoints ---------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write weights (HF names), optimizer, proximal snapshot and RNG states to directory `path`."""
        mckpt.save_backend(self, path)

    def load(self, path: str) -> None:
        """Restore what `save` wrote. Weights re-shard to any layout; the optimizer needs the same layout."""
        mckpt.load_backend(self, path)

    def __repr__(self) -> str:
        l = self.layout
        return (f"MegatronTrainerBackend({self.arch.model_type}, tp={l.tp}, ep={l.ep}, dp={l.dp}, "
                f"dtype={self.dtype}, rank={self.rank})")
