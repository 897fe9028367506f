"""A Megatron rank's step rehearsed at its real shapes: the micro-batch at the preset's token budget, forward
through the rank's layers at its tp/cp/ep/etp shard widths, the trainer's log-prob head, backward, gradient
reduction and the optimizer step, each phase under torch's `MemTracker` on fake tensors.

Why scaled: under fake tensors one MoE layer (its 16 local experts, forward, recompute and backward) costs seconds
on this CPU, so 48 layers take many minutes. The rank is therefore stepped twice, at n = 1 and n = 2 decoder
layers of the model's one layer kind, at full width (`rehearse_scaled`), each build the trainer's own
(`build_trainer_backend`, the reference's too) over the same fake world and parallel groups, and every phase's
peak — total and each category — is extrapolated to the stage's L layers:

    peak_L = peak_1 + (L − 1) · (peak_2 − peak_1)

exact for what grows by layer (each layer's weights, main gradients, optimizer shard, its recompute checkpoint)
and for what does not (embedding, head, the one layer rebuilt in the backward, the head's chunk); the output
says so. A model with more than one layer kind (dense and MoE layers mixed) is stepped at its full depth instead.

The phases, each its own tracker over the rank's resident tensors (weights, the DDP main-gradient buffers, the
distributed optimizer's fp32 shard and its m, v — created by a warm-up step first, as after the run's first
update):

    reference log-prob   `use_kl_loss`: the frozen reference's no-grad forward and head (its weights on the device
                         for the pass, also with `ref_param_offload`)
    proximal log-prob    decoupled mode: the policy's no-grad forward and head (π_prox)
    update               `_forward` (pack, GPTModel, the head as configured: chunked, or the CP path's owned
                         positions), backward of the masked token-mean of −A·log π, `finalize_model_grads`
                         (the distributed optimizer's reduce-scatter)
    optimizer step       AdamW on the fp32 shard, the copy back into the bf16 parameters
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.rehearse.batch import micro_shape, rehearsal_batch
from engine.rehearse.fake import tracker_peak
from engine.rehearse.torch_rank import Phase, surrogate_loss

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

PhasePeaks = dict[str, tuple[int, dict[str, int]]]
CATEGORY = {"param": "weights", "act": "activations", "temp": "temporaries", "opt": "optimizer",
            "oth": "main_grads", "buffer": "buffers", "grad": "grads"}
"""The tracker's categories under the names the report uses (`oth`: the tensors registered from outside — the
main-gradient buffers and the optimizer's fp32 shards, the latter moved to `optimizer`)."""


def tracker_class() -> Any:
    """torch's `MemTracker`, which installs gradient hooks only on modules that train (a frozen reference's
    forward would otherwise fail: no hook on a tensor without gradient) and passes over Megatron's DDP wrapper."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            if not callable(module.buffers):  # Megatron's DDP wrapper (`buffers`: its grad buffers, a list);
                return 0, 0  # its parameters are the GPTModel's, tracked at the GPTModel's own forward
            trains = all(p.requires_grad for p in module.parameters())
            return super()._track_module_params_and_buffers(module, install_grad_hooks and trains)

    return Tracker


def grad_buffers(policy: Any) -> list[torch.Tensor]:
    return [b.grad_data for b in [*policy.ddp.buffers, *policy.ddp.expert_parallel_buffers]]


def _categories(cats: dict[str, int], mains: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in cats.items():
        out[CATEGORY.get(k, k)] = out.get(CATEGORY.get(k, k), 0) + v
    if mains:
        moved = min(mains, out.get("main_grads", 0))
        out["main_grads"] = out.get("main_grads", 0) - moved
        out["optimizer"] = out.get("optimizer", 0) + moved
    return {k: v for k, v in out.items() if v}


def step_phases(cfg: RunConfig, policy: Any, ref: Any, vocab: int, rank: int) -> PhasePeaks:
    """Each phase's (peak, peak by category) of one Megatron rank (module docstring)."""
    from megatron.core.distributed import finalize_model_grads

    from engine.trainer.batch import plan_micro_batches, trim_padding

    update = rehearsal_batch(micro_shape(cfg), vocab)
    log_prob = rehearsal_batch(micro_shape(cfg, log_prob=True), vocab)
    opt = policy.optimizer
    opt.step_tensors()  # warm-up: AdamW's m and v exist from the run's first update on
    policy.ddp.zero_grad_buffer()
    mains = opt.nbytes
    out: PhasePeaks = {}

    def tracked(name: str, role: str, fn: Callable[[], None], *extra: Any) -> None:
        tracker = tracker_class()()
        tracker.track_external(policy.model, *grad_buffers(policy), *opt.mains, opt.opt, *extra)
        with Phase(role, rank, name), tracker:
            fn()
        total, cats = tracker_peak(tracker)
        out[name] = (total, _categories(cats, mains))

    def no_grad_pass(backend: Any) -> Callable[[], None]:
        def run() -> None:
            backend.ddp.eval()
            micros, _ = plan_micro_batches(log_prob, backend.micro_batch_size, backend.log_prob_budget, lambda k: k)
            with torch.no_grad():
                backend._forward(trim_padding(micros[0])[0], False)
        return run

    if ref is not None:
        tracked("reference log-prob", "reference", no_grad_pass(ref), ref.model)
    if not cfg.algorithm.rollout_correction.bypass_mode:
        tracked("proximal log-prob", "trainer", no_grad_pass(policy))

    def update_pass() -> None:
        policy.ddp.train()
        micros, _ = plan_micro_batches(update, policy.micro_batch_size, policy.update_budget, lambda k: k)
        policy.ddp.zero_grad_buffer()
        micro, _ = trim_padding(micros[0])
        log_probs, entropy = policy._forward(micro, policy.entropy_mode != "none")
        loss = surrogate_loss(log_probs, entropy, micro, policy.entropy_mode == "grad")
        (loss * policy.dp_size * policy.layout.cp).backward()
        finalize_model_grads([policy.ddp])

    tracked("update", "trainer", update_pass)
    tracked("optimizer step", "trainer", opt.step_tensors)
    return out


def layer_kinds(config: dict[str, Any]) -> int:
    """Distinct decoder-layer kinds of a config.json (dense / MoE): 1 when every layer is alike."""
    from engine.trainer.megatron.hf_config import arch_from_hf_config

    return len(set(arch_from_hf_config(config).moe_layers)) or 1


def extrapolate(one: PhasePeaks, two: PhasePeaks, layers: int) -> PhasePeaks:
    """peak_L = peak_1 + (L − 1)(peak_2 − peak_1), per phase, for the total and each category."""
    out: PhasePeaks = {}
    for name, (t1, c1) in one.items():
        t2, c2 = two[name]
        cats = {k: c1.get(k, 0) + (layers - 1) * (c2.get(k, 0) - c1.get(k, 0)) for k in {*c1, *c2}}
        out[name] = (t1 + (layers - 1) * (t2 - t1), {k: v for k, v in cats.items() if v})
    return out


def rehearse_scaled(cfg: RunConfig, config: dict[str, Any], build: Callable[[str, dict[str, Any]], tuple[Any, Any]],
                    rank: int, notes: list[str]) -> PhasePeaks:
    """The step's phase peaks at the stage's L layers: stepped at 1 and 2 layers and extrapolated, or at L for
    a model of mixed layer kinds (module docstring). `build(model_dir, config)` → (policy, reference or None)."""
    from engine.trainer.megatron.hf_config import arch_from_hf_config

    arch = arch_from_hf_config(config)
    layers = arch.num_layers // max(1, cfg.trainer.pp)
    kinds = layer_kinds(config)
    depths = [layers] if kinds > 1 else [1, 2]
    runs: list[PhasePeaks] = []
    for n in depths:
        start = time.perf_counter()
        sub = dict(config, num_hidden_layers=n * max(1, cfg.trainer.pp))
        with tempfile.TemporaryDirectory(prefix="asyncrl-rehearse-") as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(sub))
            policy, ref = build(tmp, sub)
            runs.append(step_phases(cfg, policy, ref, arch.vocab_size, rank))
        notes.append(f"step at {n} decoder layer(s) per stage: {time.perf_counter() - start:.0f} s")
    if kinds > 1:
        notes.append(f"step rehearsed at the stage's full depth ({layers} layers: {kinds} layer kinds)")
        return runs[0]
    notes.append(f"step scaled to the stage's {layers} layers (one layer kind, "
                 f"{'MoE' if arch.is_moe else 'dense'}): stepped at 1 and 2 layers at full width, each phase's peak "
                 f"and category extrapolated as peak_1 + (L − 1)·(peak_2 − peak_1)")
    return extrapolate(runs[0], runs[1], layers)
