"""One FSDP2 trainer rank (`trainer.backend = "torch"`, M > 1) rehearsed at full scale on fake tensors.

The rank is built by `engine.runtime.backends.build_trainer_backend(distributed=True)` — the function
`TrainerRank` calls at launch — over a fake world of M ranks (`engine.rehearse.fake`), with one seam: rank 0's
model comes from its config.json on fake tensors (`load_model`) instead of from weights. Every rank takes launch's
branch: rank 0 loads, every rank builds the meta skeleton (`meta_causal_lm`), shards it, allocates its shards and
fills them from rank 0's load (`engine.trainer.fsdp.shard_from_rank0`: `set_model_state_dict(...,
broadcast_from_rank0=True)`, then the buffers). The fake group's object broadcast delivers nothing, so
`fake.FromRank0` hands a rank other than 0 the key → size/dtype list rank 0 sent when it was rehearsed, and checks
that the rank made the same object broadcasts and built the same parameters and buffers (shape, dtype) as rank 0.
The CPU stands in for the device (FSDP2's mesh, mixed-precision policy and kernels are the CPU's; no
`set_device`), the process group is the fake one, so no collective moves data and none can deadlock. Then, under
`FSDPMemTracker`:

    proximal log-prob   decoupled mode (`bypass_mode = false`): `snapshot_params` and `proximal_log_probs` of the
                        log-prob micro-batch (the backend's own methods: swap, no-grad forward, restore)
    reference           `use_kl_loss`: the frozen reference's `compute_log_probs` (its all-gathers and activations
                        are tracked; its resident shards, built before tracking, are added to every peak)
    update              the tensor path of `_update` on a short micro-batch, then the update's largest (so the
                        gradient shards of the first are resident, as in any update of several micro-batches):
                        `_prepare` (trim), `_log_probs`
                        (chunked head, entropy as the loss asks), backward of the loss scaled by `_grad_scale`,
                        `clip_grad_norm_`, AdamW `step` (its state created by a warm-up step before tracking, as
                        after the run's first update), `zero_grad`

The PPO loss itself is not called: it reads its metrics with `.item()`, which fake tensors cannot answer; the
backward runs from the masked token-mean of −A·log π (plus the entropy where it carries gradient), the same
graph through the model and the head. Outside the tracker, the host side: the weight export up to its buckets
(`export_weights`, the real generator: bytes, dtypes, bucket count, whether it was gathered to the host) and the
checkpoint's state dicts (`full_state_dict` and `get_optimizer_state_dict` with the options `save` uses).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.plan.devices import RoleDevice
from engine.rehearse.batch import MicroShape, micro_shape, rehearsal_batch
from engine.rehearse.fake import (
    FromRank0, fake_mode, fake_world, model_from_config, pin_in_place, tensor_bytes, tracker_peak,
)
from engine.rehearse.report import RankClass, RehearsalFailure, first_line
from engine.sync.fp8 import quantized

if TYPE_CHECKING:
    from engine.config.schema import RunConfig
    from engine.plan.run_plan import RunPlan

STAND_IN = RoleDevice("cpu", "none")
LEAD = MicroShape(1, 16, 16, None)
"""The short micro-batch the update runs before the preset's largest (one row of 16 + 16 tokens)."""
"""The device the rehearsal computes on in place of the preset's (fake tensors: nothing is computed)."""


class Phase:
    """Runs one phase of a rank; any error becomes a `RehearsalFailure` naming role, rank and phase."""

    def __init__(self, role: str, rank: int, phase: str) -> None:
        self.role, self.rank, self.phase = role, rank, phase

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and not isinstance(exc, RehearsalFailure):
            raise RehearsalFailure(self.role, self.rank, self.phase, first_line(exc)) from exc
        return False


def _loader(config: dict[str, Any], mode: Any, host: list[int]):
    """`load_causal_lm`'s stand-in: the model from `config` on fake tensors; records the bytes it holds (the
    host memory the real loader fills before the model moves to the device). Called where launch calls the
    loader: FSDP2's rank 0 (and every rank for an offloaded reference)."""

    def load(model_dir: str, dtype: Any = "float32", *, attn_implementation: str | None = None, **_: Any) -> Any:
        model = model_from_config(config, dtype, mode, attn_implementation)
        host.append(tensor_bytes([*model.parameters(), *model.buffers()]))  # a tied weight counted once
        return pin_in_place(model)

    return load


class Tracking:
    """The tracker a phase runs under, if any (set by `_step` while its `FSDPMemTracker` is open)."""

    tracker: Any = None


def forward_in(backend: Any, mode: Any, tracking: Tracking) -> Any:
    """Run `backend`'s forwards (`_log_probs`) inside `mode`. Only there: the batch's bookkeeping (row lengths,
    trimming, micro-batch plans) reads its tensors' values, so it must stay on real tensors, while a model
    forward creates tensors of its own (masks, positions) that must be fake like its parameters. The open
    tracker is re-entered on top of `mode` (its depth counter allows it): a dispatch mode below the fake mode
    would never see the forward's allocations — the activations — since the fake mode runs every op itself."""
    inner = backend._log_probs

    def log_probs(*args: Any, **kwargs: Any) -> Any:
        with mode, tracking.tracker or contextlib.nullcontext():
            return inner(*args, **kwargs)

    backend._log_probs = log_probs
    return backend


def surrogate_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, micro: Any,
                    entropy_grad: bool) -> torch.Tensor:
    """Token-mean of −A·log π over the response mask (the PPO loss's graph without its `.item()` metrics)."""
    mask = micro.response_mask.to(log_probs.dtype)
    loss = -(log_probs * micro.advantages.to(log_probs.dtype) * mask).sum() / mask.sum().clamp(min=1)
    if entropy_grad and entropy is not None:
        loss = loss - (entropy * mask).sum() / mask.sum().clamp(min=1)
    return loss


def rehearse_torch_rank(plan: RunPlan, config: dict[str, Any], rank: int, cls: RankClass,
                        step: bool = True, rank0: FromRank0 | None = None) -> RankClass:
    """Rehearse rank `rank` of `plan`'s FSDP2 trainer (module docstring) into `cls`; `step`: take the step
    (False: build, export and checkpoint only — the rank's step is the representative's). `rank0`: what rank 0
    sent when it was rehearsed (a rank other than 0 needs it: it receives its shards from rank 0)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from engine.algo.loss import build_loss_fn
    from engine.runtime.backends import build_reference_backend, build_trainer_backend

    cfg = plan.config
    spec = plan.role_specs().trainer
    start = time.perf_counter()
    mode = fake_mode()
    host: list[int] = []
    rank0 = rank0 if rank0 is not None else FromRank0()
    with fake_world(rank, spec.world), tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(config))  # the meta skeleton's config
        with Phase("trainer", rank, "build"):
            with rank0.scope("trainer"):
                policy = build_trainer_backend(spec.backend, model_dir, distributed=True, device=STAND_IN,
                                               load_model=_loader(config, mode, host))
            rank0.compare("trainer", policy.model)
        ref = None
        if spec.loss.use_kl_loss:
            with Phase("reference", rank, "build"):
                with rank0.scope("reference"):
                    ref = build_reference_backend(spec.backend, model_dir, distributed=True, device=STAND_IN,
                                                  load_model=_loader(config, mode, host))
                rank0.compare("reference", ref.model)
            if ref.param_offload:  # loaded whole on every rank
                cls.host_resident += tensor_bytes(list(ref.model.parameters()))
        cls.host_start = sum(host)
        if rank:
            cls.notes.append(_start_note(rank0, policy, ref, cls.host_start))
        if not cfg.algorithm.rollout_correction.bypass_mode:  # decoupled: every rank holds its shards' π_prox
            with Phase("trainer", rank, "proximal snapshot"), mode:
                policy.snapshot_params()  # TrainerCore takes it at start; host memory (pinned on the device's host)
                policy._live = policy._cpu_buffers()  # the swap's host copy of the live weights, made on first use
            snapshot = tensor_bytes(policy._snapshot) + tensor_bytes(policy._live)
            cls.host_resident += snapshot
            cls.notes.append(f"π_prox snapshot and swap buffers are host memory: {snapshot / 1e9:.2f} GB")
        vocab = int(policy.model.config.get_text_config().vocab_size)
        tracking = Tracking()
        forward_in(policy, mode, tracking)
        if ref is not None:
            forward_in(ref, mode, tracking)
        if step:
            _step(cfg, policy, ref, mode, vocab, rank, cls, tracker_class(FSDPMemTracker, mode), build_loss_fn,
                  tracking)
        with Phase("weight sync", rank, "export"), mode:
            _export(policy, spec.weight_sync.bucket_bytes, cls, spec.weight_sync.quantization)
        with Phase("trainer", rank, "checkpoint"), mode:
            _checkpoint(policy, cls)
    cls.seconds = time.perf_counter() - start
    return cls


def _start_note(rank0: FromRank0, policy: Any, ref: Any, host: int) -> str:
    """How a rank other than 0 started: launch's path from rank 0's load, and its bytes at start."""
    models = [b for b in (policy, ref) if b is not None and not b.param_offload]
    shards = sum(tensor_bytes(list(b.model.parameters())) for b in models)
    largest = max(rank0.largest_tensor(name) for name in ("trainer", "reference"))
    held = f"{host / 1e9:.2f} GB on the host (the offloaded reference it loads)" if host else "nothing on the host"
    return (f"built as launch builds it: meta skeleton, sharded, shards filled from rank 0's load "
            f"(shard_from_rank0, broadcast_from_rank0): at start {held}; on the device its shards "
            f"({shards / 1e9:.2f} GB) and one full tensor at a time while receiving (the largest "
            f"{largest / 1e9:.2f} GB)")


def tracker_class(base: Any, mode: Any) -> Any:
    """`FSDPMemTracker`, with two changes. (1) It counts the ops of the rehearsal's fake mode `mode` as well as
    those run outside any fake mode (the backward): torch's tracker counts only ops under the fake mode active
    when it was entered (so that DTensor's sharding propagation, run under a fake mode of its own, is not
    counted); a nested mode of another identity is still skipped. (2) It skips the post-backward of an FSDP unit
    the step never ran (a vision-language model's vision blocks on text rows), where torch's tracker reads an
    unsharded parameter that was never made."""
    from torch._guards import active_fake_mode

    class Tracker(base):
        @property
        def _fake_mode_on_entry(self) -> Any:
            active = active_fake_mode()
            return active if active is None or active is mode else object()

        @_fake_mode_on_entry.setter
        def _fake_mode_on_entry(self, _: Any) -> None:
            pass

        def _fsdp_param_group_post_backward(self, fsdp_mod: Any, orig: Any) -> Any:
            wrapped = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            def inner(*args: Any, **kwargs: Any) -> Any:
                group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                idle = group is not None and any(not hasattr(p, "_unsharded_param") for p in group.fsdp_params)
                return (orig if idle else wrapped)(*args, **kwargs)

            return inner

    return Tracker


def _step(cfg: RunConfig, policy: Any, ref: Any, mode: Any, vocab: int, rank: int, cls: RankClass,
          tracker_cls: Any, build_loss_fn: Any, tracking: Tracking) -> None:
    rc = cfg.algorithm.rollout_correction
    loss_fn = build_loss_fn(cfg.trainer, rc)
    update = rehearsal_batch(micro_shape(cfg), vocab)
    log_prob = rehearsal_batch(micro_shape(cfg, log_prob=True), vocab)
    with Phase("trainer", rank, "optimizer state"), mode:
        for p in policy.model.parameters():
            p.grad = torch.zeros_like(p)
        policy.optimizer.step()
        policy.optimizer.zero_grad(set_to_none=True)
    decoupled = not rc.bypass_mode
    # the reference's shards, made before tracking (after its forward FSDP2 leaves its root unsharded: those
    # tensors are allocated inside the tracker and counted there)
    resident = tensor_bytes(list(ref.model.parameters())) if ref is not None and not ref.param_offload else 0
    tracker = tracking.tracker = tracker_cls(policy.model, policy.optimizer)
    with tracker:
        if decoupled:
            with Phase("trainer", rank, "proximal log-prob"):
                policy.proximal_log_probs(log_prob)
            cls.phase_peaks["proximal log-prob"] = tracker_peak(tracker)[0]
            tracker.reset_mod_stats()  # the tracker's module stats cover one forward per module; its peak stays
        if ref is not None:
            with Phase("reference", rank, "log-prob"):
                ref.compute_log_probs(log_prob)
            cls.phase_peaks["reference log-prob"] = tracker_peak(tracker)[0]
            tracker.reset_mod_stats()
        with Phase("trainer", rank, "update"):
            policy.model.train()
            # a short micro-batch first, as any micro-batch before the last: the largest then runs with the
            # gradient shards it left resident, as every micro-batch after a rank's first does
            lead, _, _ = policy._micro_batches(rehearsal_batch(LEAD, vocab, seed=1), policy.ppo_max_token_len)
            micros = lead + policy._micro_batches(update, policy.ppo_max_token_len)[0]
            entropy_grad = policy.entropy_mode == "grad" or bool(getattr(loss_fn, "needs_entropy", False))
            with_entropy = policy.entropy_mode != "none" or entropy_grad
            policy.optimizer.zero_grad(set_to_none=True)
            for k, micro in enumerate(micros):
                micro, _ = policy._prepare(micro)
                policy._set_grad_sync(k == len(micros) - 1)
                log_probs, entropy = policy._log_probs(micro, with_entropy, entropy_grad)
                loss = surrogate_loss(log_probs, entropy, micro, entropy_grad)
                (loss * policy._grad_scale()).backward()
                tracker.reset_mod_stats()  # module stats cover one forward per module; the peak stays
            params = [p for p in policy.model.parameters() if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, policy.grad_clip if policy.grad_clip > 0 else float("inf"))
            policy.optimizer.step()
            policy.optimizer.zero_grad(set_to_none=True)
        cls.phase_peaks["update"] = tracker_peak(tracker)[0]
    tracking.tracker = None
    cls.device_peak, cls.peak_by_category = tracker_peak(tracker)
    if resident:  # the reference's shards stay on the device throughout
        cls.device_peak += resident
        cls.peak_by_category["reference_shards"] = resident
        cls.phase_peaks = {k: v + resident for k, v in cls.phase_peaks.items()}


def _export(policy: Any, bucket_bytes: int, cls: RankClass, quantization: str | None = None) -> None:
    """The export up to its buckets: what `export_weights` yields on this rank."""
    kept: list[torch.Tensor] = []  # held, so no tensor's id is reused by a later one
    seen: set[int] = set()
    total, buckets, by_dtype, names = 0, 0, {}, 0
    for bucket in quantized(policy.export_weights(bucket_bytes)) if quantization == "fp8" \
            else policy.export_weights(bucket_bytes):  # fp8: what the sender sends (engine.sync.fp8)
        buckets += 1
        for t in bucket.values():
            names += 1
            if id(t) in seen:
                continue
            seen.add(id(t))
            kept.append(t)
            n = t.numel() * t.element_size()
            total += n
            dt = str(t.dtype).removeprefix("torch.")
            by_dtype[dt] = by_dtype.get(dt, 0) + n
    cls.host_export = 0  # `torch_weights.export`: per tensor, cast and all-gathered on the device
    cls.sync = {"bytes": total, "dtypes": by_dtype, "buckets": buckets, "tensors": names,
                "bucket_bytes": bucket_bytes, "staged_on": "device", "stages": bool(total)}


def _checkpoint(policy: Any, cls: RankClass) -> None:
    """The state `save` writes on this rank and the host bytes it holds: FSDP2 (`torch_weights.save_sharded`):
    the rank's own shards of the model and optimizer, written by torch distributed checkpoint, nothing gathered;
    one process (`torch_weights.save`): the full state on the host, written by rank 0."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    sharded = type(policy).__name__ == "FSDPTrainerBackend"
    if sharded:
        model_state, optim_state = get_state_dict(policy.model, policy.optimizer)
        w, o = tensor_bytes(model_state), tensor_bytes(optim_state)
        cls.host_save = 0  # written shard by shard from where they live
        writes = ["dcp shard (model + optimizer)", "rng"] + (["state.json"] if policy.is_main else [])
    else:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        weights = policy.full_state_dict()
        optim = get_optimizer_state_dict(policy.model, policy.optimizer, options=policy._state_dict_options())
        w, o = tensor_bytes(weights), tensor_bytes(optim)
        cls.host_save = w + o
        writes = ["rng"] + (["model.safetensors", "optimizer.pt"] if policy.is_main else [])
    cls.checkpoint = {"writes": writes, "weights_bytes": w, "optimizer_bytes": o, "full_gather": not sharded}


def torch_rank_classes(world: int) -> list[RankClass]:
    """FSDP2's rank classes: rank 0 sends the weights and writes the checkpoint; ranks 1 … M−1 only shard."""
    classes = [RankClass("rank 0 (sender, checkpoint writer)", "0", 0)]
    if world > 1:
        classes.append(RankClass("rank 1 (others)", f"1-{world - 1}" if world > 2 else "1", 1))
    return classes
