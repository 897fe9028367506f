"""The `torch` trainer backend: a transformers causal LM, AdamW, micro-batched gradient accumulation.

One `train_step(batch, loss_fn)` is one local step: `mini_batches × ppo_epochs` optimizer updates, verl's
mini-batch loop (`engine.trainer.minibatch.mini_batch_plan` gives the split; the PPO ratios use the batch's
fixed `old_log_probs` in every pass). Each update's mini-batch is split into micro-batches
b_1 … b_k of `micro_batch_size` rows — or, with `use_dynamic_bsz`, into micro-batches of at most
`ppo_max_token_len_per_gpu` padded tokens (rows × longest row) (`log_prob_max_token_len_per_gpu` for the no-grad log-prob passes; the
ranks agree on one count, see `engine.trainer.minibatch`), each padded only to its own longest row; `loss_fn` returns a loss L_i normalised *within* b_i (token-mean,
seq-mean, …). Each micro-batch gets a mass m_i — `batch.meta["micro_weight_fn"](b_i)` if the loss supplies
one, else its count of response tokens Σ response_mask — and the accumulated gradient is

    g = Σ_i (m_i / Σ_j m_j) ∇L_i

which equals the gradient of the same loss computed over the whole batch at once (for token-mean use
token counts, for seq-mean-* use row counts). Then the pre-clip global norm ‖g‖ is logged as
`actor/grad_norm`, g is clipped to `grad_clip`, and AdamW steps at the warmup-scheduled lr (`optim.py`).
Precision (`engine.config.precision`): the parameters, gradients and AdamW state are in the dtype the model was
loaded in (fp32 = master weights, the default policy); `precision` is the compute dtype. Below the parameters'
dtype every forward runs under `torch.autocast(compute)` (the FSDP2 subclass casts by its
`MixedPrecisionPolicy` instead): matmuls compute in bf16 (and their backward too), while the log-softmax
(`logprobs.py`), the loss and the update stay fp32. `gradient_checkpointing` recomputes each decoder layer in
backward (HF's mechanism); `logprob_chunk_tokens` bounds the log-prob head's logits (`logprobs.py`).
`shared_prompt` forwards each micro-batch's rows that share a prompt (a GRPO group) as one sequence, the prompt
once (`shared_prefix.py`: the same log-probs and gradient, fewer tokens) where `shared_prefix.worth_sharing` says it applies and pays.
`use_remove_padding` forwards the rows without padding (`packed_rows.py`; the packing with fewer tokens runs), and
token budgets then count the packed tokens (`packed_rows.packed_cost`) instead of rows × longest row.
`frozen = True` builds a reference model (`engine.runtime.backends.build_reference_backend`): no gradients, no optimizer, only
`compute_log_probs`, with its weights in host memory between calls when `param_offload` (on an accelerator).
An update whose gradient is non-finite, or whose total mass is 0, is skipped (counted in `actor/skipped_step`).
The learning-rate schedule counts optimizer updates. Micro-batches carry `meta["ppo_epoch"]` and
`meta["fresh"]` (True while no update of this local step has been applied yet), so a loss wrapper can tell a
row's first forward at the local step's starting weights from later ones.

Vision-language models (Qwen3-VL): rows carry their prompt's images in `meta["images"]` (see
`engine.trainer.batch.collate`); every forward gets their pixel values (from the model directory's image
processor, or `image_encoder`) and 3-D rotary positions, and the placeholder tokens are masked out of π
(`engine.trainer.logprobs`), exactly as the `hf` sampler does. The loss still counts response tokens only.

The distributed subclass (`fsdp.py`) only overrides the hooks marked "distributed hook". A rank without rows of
its own is handed a `FILLER` batch (`engine.trainer.batch.shard_rows`): it runs the collectives with weight 0
and returns no log-probs.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions

from engine.multimodal.forward import vision_inputs
from engine.multimodal.vision import ImageEncoder, VisionSpec, model_dir_of, placeholder_token_ids
from engine.trainer import torch_weights, version_weights
from engine.trainer.torch_weights import tied_aliases
from engine.trainer.base import LossFn, TrainBatch
from engine.trainer.batch import FILLER, is_filler, lockstep_log_probs, plan_micro_batches, trim_padding
from engine.trainer.logprobs import response_log_probs
from engine.trainer.packed_rows import packed_forward_batch, packing_layout
from engine.trainer.shared_prefix import SharedBatch, shared_prompt_log_probs
from engine.trainer.minibatch import local_step_metrics, mini_batch_plan
from engine.trainer.optim import OptimConfig, WarmupSchedule, build_optimizer, set_lr
from engine.trainer.step_metrics import update_metrics

EntropyMode = Literal["none", "metric", "grad"]
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""`precision` (the policy's compute dtype) → torch dtype."""
MicroWeightFn = Callable[[TrainBatch], float]


def token_mass(micro: TrainBatch) -> float:
    """Default micro-batch mass: its number of response tokens."""
    return float(micro.response_mask.sum())


def select_mini_batch(batch: TrainBatch, idx: list[int]) -> TrainBatch:
    """Rows `idx` of `batch`; with no rows (this rank's share of a mini-batch is empty, or `batch` is a
    `FILLER`) a `FILLER` stand-in, so the rank still joins the update's collectives with weight 0."""
    if idx and not is_filler(batch):
        return batch.select(torch.tensor(idx, dtype=torch.long))
    filler = batch.select(slice(0, 1))
    filler.meta[FILLER] = True
    return filler


def enable_recompute(model: torch.nn.Module) -> None:
    """`trainer.enable_gradient_checkpointing`: HF's per-decoder-layer checkpointing (non-reentrant), each layer's
    forward recomputed in the backward in train mode (the long-row study turns it on the same way)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class TorchTrainerBackend(WarmupSchedule):
    """`TrainerBackend` for one process (the FSDP2 subclass handles several).

    `entropy`: what `train_step` hands the loss as entropy — "none" (None), "metric" (detached, for the
    `actor/entropy` metric) or "grad" (differentiable, for an entropy bonus). A loss function with a truthy
    `needs_entropy` attribute always gets the differentiable entropy.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        optim_cfg: Mapping[str, Any],
        grad_clip: float = 1.0,
        micro_batch_size: int = 8,
        temperature: float = 1.0,
        device: str | torch.device = "cpu",
        entropy: EntropyMode = "metric",
        image_encoder: ImageEncoder | None = None,
        mini_batches: int = 1,
        ppo_epochs: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        precision: Literal["fp32", "bf16"] = "fp32",
        gradient_checkpointing: bool = False,
        logprob_chunk_tokens: int | None = None,
        frozen: bool = False,
        param_offload: bool = False,
        use_dynamic_bsz: bool = False,
        ppo_max_token_len_per_gpu: int = 16384,
        log_prob_max_token_len_per_gpu: int | None = None,
        shared_prompt: bool = True,
        use_remove_padding: bool = False,
        export_dtype: str | torch.dtype | None = None,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError("micro_batch_size must be >= 1")
        if mini_batches < 1 or ppo_epochs < 1:
            raise ValueError("mini_batches and ppo_epochs must be >= 1")
        if temperature <= 0:
            raise ValueError("temperature must be > 0 (log-probs are taken at the rollout temperature)")
        self.device = torch.device(device)
        self.optim_cfg = OptimConfig.from_dict(optim_cfg)
        self.grad_clip = float(grad_clip)
        self.micro_batch_size = int(micro_batch_size)
        if ppo_max_token_len_per_gpu < 1 or (log_prob_max_token_len_per_gpu or 1) < 1:
            raise ValueError("token budgets must be >= 1")
        self.use_dynamic_bsz = bool(use_dynamic_bsz)
        self.ppo_max_token_len = int(ppo_max_token_len_per_gpu)
        self.log_prob_max_token_len = int(log_prob_max_token_len_per_gpu or ppo_max_token_len_per_gpu)
        self.mini_batches, self.ppo_epochs = int(mini_batches), int(ppo_epochs)
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.temperature = float(temperature)
        if precision not in COMPUTE_DTYPES:
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
        self.precision = precision
        self.compute_dtype = COMPUTE_DTYPES[precision]
        self.param_dtype = next(model.parameters()).dtype
        self.export_dtype = getattr(torch, export_dtype) if isinstance(export_dtype, str) else export_dtype
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.shared_prompt = bool(shared_prompt)
        self._forward_tokens = [0, 0]  # this local step's forwards: padded row tokens, tokens forwarded
        self.frozen, self.param_offload = bool(frozen), bool(param_offload) and torch.device(device).type != "cpu"
        if frozen:  # a reference: no gradients, no optimizer (`engine.runtime.backends.build_reference_backend`)
            model.requires_grad_(False)
            model.eval()
        elif gradient_checkpointing:
            enable_recompute(model)
        self.entropy_mode: EntropyMode = entropy
        self.aliases = tied_aliases(model)
        self.vision = VisionSpec.from_config(getattr(model, "config", None))
        self.suppress_ids = placeholder_token_ids(model.config) if self.vision is not None else []
        self._encoder = image_encoder
        self._model_dir = model_dir_of(model)
        self.model = self._prepare_model(model)
        self.packing = packing_layout(self.model, use_remove_padding and self.vision is None, self.device,
                                      self.compute_dtype)
        self.optimizer = None if frozen else build_optimizer(self.model.parameters(), self.optim_cfg)
        if self.param_offload:
            self._offload(True)
        self.base_lr, self.warmup_steps = self.optim_cfg.lr, self.optim_cfg.warmup_steps
        self.global_step = 0
        self.extra_metrics: dict[str, float] = {}
        self._snapshot: list[torch.Tensor] | None = None
        self._live: list[torch.Tensor] | None = None
        self._swapped = False  # the snapshot is in the parameters (`snapshot_swap`)
        self._swapped_params: list[torch.Tensor] | None = None  # the tensors the snapshot was swapped into
        self._plain_state: bool | None = None  # `full_state_dict`: whether `model.state_dict()` gives the same

    # --- distributed hooks (identity for one process) --------------------------------------------------
    def _prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def _sum_across_ranks(self, values: list[float]) -> list[float]:
        return values

    def _max_across_ranks(self, value: int) -> int:
        return value

    def _grad_scale(self) -> float:
        """Factor that turns the ranks' gradient reduction into a sum (FSDP averages over ranks)."""
        return 1.0

    def _set_grad_sync(self, enabled: bool) -> None:
        pass

    def _local_params(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.model.parameters()]

    def _barrier(self) -> None:
        pass

    @property
    def rank(self) -> int:
        return 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _state_dict_options(self, loading: bool = False) -> StateDictOptions:
        return StateDictOptions(full_state_dict=True, cpu_offload=not loading)

    # --- forward ----------------------------------------------------------------------------------------
    def _to_device(self, batch: TrainBatch) -> TrainBatch:
        return batch.to(self.device)

    def _prepare(self, micro: TrainBatch) -> tuple[TrainBatch, int]:
        """Trim all-padding columns and move to the device; returns the batch and the original width R."""
        trimmed, r_full = trim_padding(micro)
        return self._to_device(trimmed), r_full

    @property
    def image_encoder(self) -> ImageEncoder:
        """The encoder of the model's image processor (from the model directory on first use)."""
        if self._encoder is None:
            if self._model_dir is None:
                raise ValueError("a batch with images needs `image_encoder` when the model was not loaded from "
                                 "a local directory")
            self._encoder = ImageEncoder.for_model_dir(self._model_dir)
        return self._encoder

    def _model_kwargs(self, micro: TrainBatch) -> dict[str, torch.Tensor] | None:
        """Image inputs and 3-D positions of a micro-batch whose rows carry images, else None."""
        images = micro.meta.get("images")
        if not images or not any(images):
            return None
        if self.vision is None:
            raise ValueError("the batch has images but the model is text-only")
        vis = vision_inputs(self.model, self.image_encoder, micro.input_ids, micro.attention_mask, images)
        return None if vis is None else vis.model_kwargs()

    def _autocast(self) -> bool:
        """Compute below the parameters' dtype by autocast (one rank; FSDP2 casts by its MixedPrecisionPolicy)."""
        return self.compute_dtype != self.param_dtype

    def _offload(self, to_host: bool) -> None:
        """`param_offload` (a frozen reference on an accelerator): weights to host memory, or back."""
        self.model.to("cpu" if to_host else self.device)

    def _log_probs(
        self, micro: TrainBatch, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        model_kwargs = self._model_kwargs(micro)
        packed = self._shared(micro) if model_kwargs is None else None
        self._forward_tokens[0] += micro.input_ids.numel()
        self._forward_tokens[1] += micro.input_ids.numel() if packed is None else packed.tokens
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self._autocast()):
            if packed is not None:
                return shared_prompt_log_probs(
                    self.model, packed, micro.responses, self.temperature, with_entropy, entropy_grad=entropy_grad,
                    suppress_ids=self.suppress_ids, chunk_tokens=self.logprob_chunk_tokens,
                )
            return response_log_probs(
                self.model, micro.input_ids, micro.attention_mask, micro.position_ids, micro.responses,
                self.temperature, with_entropy, entropy_grad=entropy_grad, model_kwargs=model_kwargs,
                suppress_ids=self.suppress_ids, chunk_tokens=self.logprob_chunk_tokens,
            )

    def _shared(self, micro: TrainBatch) -> SharedBatch | None:
        """`micro` packed by shared prompts or as packed rows (`packed_rows.packed_forward_batch`), else None (the
        padded rows are forwarded as they are)."""
        return packed_forward_batch(self.model, micro.input_ids, micro.attention_mask, micro.responses.shape[1],
                                    self.shared_prompt, self.packing, self.param_dtype)

    def take_forward_saving(self) -> float:
        """Padded row tokens ÷ tokens forwarded since the last call (1.0 without shared prompts or packed rows),
        then reset."""
        rows, forwarded = self._forward_tokens
        self._forward_tokens = [0, 0]
        return rows / forwarded if forwarded else 1.0

    def _micro_batches(self, batch: TrainBatch, max_tokens: int) -> tuple[list[TrainBatch], TrainBatch, list[int] | None]:
        """The micro-batches of `batch` (`plan_micro_batches`; `max_tokens` with `use_dynamic_bsz`), the one this
        rank repeats with weight 0 while other ranks still have micro-batches to run (the last one, or a
        `FILLER` batch itself, which has no real micro-batch), and the row order the micro-batches hold."""
        filler = is_filler(batch)
        if filler and not self.use_dynamic_bsz:
            return [], batch, None
        micros, order = plan_micro_batches(batch.select(slice(0, 0)) if filler else batch, self.micro_batch_size,
                                           max_tokens if self.use_dynamic_bsz else None, self._max_across_ranks,
                                           packing=self.packing)
        return micros, micros[-1] if micros else batch, order

    def compute_log_probs(self, batch: TrainBatch, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π_θ(response token) [B, R] in fp32 on CPU, at the trainer temperature (0 on padding)."""
        self.model.eval()
        micros, repeat, order = self._micro_batches(batch, self.log_prob_max_token_len)

        def forward(k: int) -> tuple[torch.Tensor, torch.Tensor | None, int]:
            micro, width = self._prepare(micros[k] if k < len(micros) else repeat)
            return (*self._log_probs(micro, with_entropy), width)

        if self.param_offload:
            self._offload(False)
        try:
            with torch.no_grad() if self.frozen else contextlib.nullcontext():
                return lockstep_log_probs(forward, self._max_across_ranks(len(micros)), len(micros),
                                          batch.response_mask, with_entropy, filler=not micros, order=order)
        finally:
            if self.param_offload:
                self._offload(True)

    # --- update -----------------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One local step: `mini_batches × ppo_epochs` optimizer updates over `batch` (see the module
        docstring); the metrics combined by `local_step_metrics`."""
        if self.optimizer is None:
            raise RuntimeError("a frozen reference model does not train")
        start = time.perf_counter()
        rows = 0 if is_filler(batch) else len(batch)
        plan = mini_batch_plan(rows, self.mini_batches, self.ppo_epochs, shuffle=self.shuffle, seed=self.seed,
                               step=self.global_step)
        tokens = float(batch.response_mask.sum()) if rows else 0.0
        updates: list[dict[str, float]] = []
        applied = 0
        for epoch, minis in enumerate(plan):
            for idx in minis:
                mini = select_mini_batch(batch, idx)
                mini.meta["ppo_epoch"], mini.meta["fresh"] = epoch, applied == 0
                updates.append(self._update(mini, loss_fn))
                applied += int(not updates[-1]["actor/skipped_step"])
        out = local_step_metrics(updates, self._sum_across_ranks([tokens])[0], self.global_step,
                                 time.perf_counter() - start, self.extra_metrics)
        out["asyncrl/trainer/shared_prompt_saving"] = self.take_forward_saving()
        self.extra_metrics = {}
        return out

    def _update(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer update over the mini-batch `batch` (see the module docstring for the weights)."""
        self.model.train()
        micros, repeat, _ = self._micro_batches(batch, self.ppo_max_token_len)
        mass_fn: MicroWeightFn = batch.meta.get("micro_weight_fn") or token_mass
        masses = [float(mass_fn(m)) for m in micros]
        (total_mass,) = self._sum_across_ranks([sum(masses)])
        steps = self._max_across_ranks(len(micros))
        # a loss with an entropy bonus says so (`needs_entropy`): its entropy must carry gradient
        entropy_grad = self.entropy_mode == "grad" or bool(getattr(loss_fn, "needs_entropy", False))
        with_entropy = self.entropy_mode != "none" or entropy_grad
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        for k in range(steps):
            real = k < len(micros)
            micro, _ = self._prepare(micros[k] if real else repeat)
            weight = masses[k] / total_mass if real and total_mass > 0 else 0.0
            self._set_grad_sync(k == steps - 1)
            log_probs, entropy = self._log_probs(micro, with_entropy, entropy_grad)
            loss, metrics = loss_fn(log_probs, entropy, micro)
            (loss * (weight * self._grad_scale())).backward()
            sums["actor/loss"] += weight * float(loss.detach())
            for name, value in metrics.items():
                sums[name] += weight * float(value)
        grad_norm = self._clip_gradients()
        skipped = total_mass <= 0 or not math.isfinite(grad_norm)
        lr = self.current_lr()
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self.global_step += 1
        self.optimizer.zero_grad(set_to_none=True)
        names = sorted(sums)
        reduced = dict(zip(names, self._sum_across_ranks([sums[n] for n in names])))
        reduced.update(update_metrics(grad_norm, lr, skipped, steps))
        return reduced

    def _clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    # --- the version's weights: π_prox and the resume's snapshot (`engine.trainer.version_weights`) -------
    def _cpu_buffers(self) -> list[torch.Tensor]:
        return version_weights.cpu_buffers(self)

    def snapshot_params(self) -> None:
        """Copy the current parameters (this rank's shards) to CPU — pinned when CUDA is available."""
        version_weights.snapshot_params(self)

    def snapshot_swap(self, to_snapshot: bool) -> None:
        """Swap the snapshot into the parameters (True) or the live values back, bit-exactly (False)."""
        version_weights.swap(self, to_snapshot)

    def proximal_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """log π_prox [B, R] under the snapshot; the live weights are copied aside and restored bit-exactly.
        The copy time is stored as `timing_s/prox_swap` in the next `train_step`'s metrics."""
        start = time.perf_counter()
        self.snapshot_swap(True)
        swap_seconds = time.perf_counter() - start
        try:
            log_probs, _ = self.compute_log_probs(batch)
        finally:
            restore_start = time.perf_counter()
            self.snapshot_swap(False)
            swap_seconds += time.perf_counter() - restore_start
        self.extra_metrics["timing_s/prox_swap"] = swap_seconds
        self.extra_metrics["timing_s/prox_log_probs"] = time.perf_counter() - start
        return log_probs

    def save_version(self, path: str) -> None:
        """Write the snapshot (the version's weights) into the trainer checkpoint directory `path`."""
        version_weights.save_version(self, path)

    def load_version(self, path: str) -> bool:
        """Restore the snapshot from `path` after `load`; False when the checkpoint holds none."""
        return version_weights.load_version(self, path)

    # --- weights out and checkpoints (`engine.trainer.torch_weights`) -----------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) weights in HF names on CPU, tied aliases included; empty on ranks ≠ 0."""
        return torch_weights.full_state_dict(self)

    def export_weights(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """HF-named tensors in the export dtype (`export_dtype`, default the parameters'), in ~`bucket_bytes`
        buckets; every rank must iterate it (the gathers are collective); only rank 0 yields buckets."""
        return torch_weights.export_live(self, bucket_bytes)

    def save(self, path: str) -> None:
        """Write weights, optimizer and RNG states to directory `path` atomically (see `checkpoint.py`)."""
        torch_weights.save(self, path)

    def load(self, path: str) -> None:
        """Restore what `save` wrote (the world size may differ for the weights and the optimizer)."""
        torch_weights.load(self, path)
