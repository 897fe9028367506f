"""MegatronTrainerBackend in one process (TP = 1, gloo world of one): parity with transformers, training,
weight export, the proximal snapshot and checkpoints in decoupled mode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from megatron_helpers import KINDS, hf_grad_norm, hf_log_probs, make_batch, nll_loss, tiny_hf_model

from engine.trainer.base import TrainerBackend
from engine.trainer.megatron.backend import MegatronTrainerBackend
from engine.trainer.megatron.parallel import ParallelConfigError

pytestmark = pytest.mark.usefixtures("process_group")

Build = Callable[..., MegatronTrainerBackend]
TEMPERATURE = 0.7


@pytest.fixture
def build(hf_dirs: dict[str, Path]) -> Build:
    def _build(kind: str, **kw: object) -> MegatronTrainerBackend:
        kw = {"optim_cfg": {"lr": 1e-2}, "micro_batch_size": 2, "temperature": TEMPERATURE} | kw
        return MegatronTrainerBackend(str(hf_dirs[kind]), **kw)

    return _build


def _params(backend: MegatronTrainerBackend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


@pytest.mark.parametrize("kind", KINDS)
def test_log_probs_and_entropy_match_transformers(build: Build, kind: str) -> None:
    backend = build(kind)
    assert isinstance(backend, TrainerBackend)
    batch = make_batch()
    log_probs, entropy = backend.compute_log_probs(batch, with_entropy=True)
    ref_lp, ref_ent = hf_log_probs(tiny_hf_model(kind), batch, TEMPERATURE)
    assert log_probs.shape == batch.responses.shape and log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_ent, atol=1e-5, rtol=0)
    assert torch.all(log_probs[batch.response_mask == 0] == 0)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_moe"])
def test_export_weights_gives_back_the_checkpoint_bit_exactly(build: Build, hf_dirs: dict[str, Path],
                                                              kind: str) -> None:
    from engine.trainer.megatron.convert import SafetensorsSource

    backend = build(kind)
    buckets = list(backend.export_weights(bucket_bytes=40_000))
    assert len(buckets) > 1
    for bucket in buckets:
        assert len(bucket) == 1 or sum(a.nbytes for a in bucket.values()) <= 40_000
    exported = {k: v for b in buckets for k, v in b.items()}  # tensors in the model's dtype
    source = SafetensorsSource(hf_dirs[kind])
    assert set(exported) == set(source.keys()) | {"lm_head.weight"}
    for name in source:
        assert torch.equal(exported[name], source(name)), name
    if kind == "qwen2":  # tied: lm_head is the embedding, and it must be sent
        assert torch.equal(exported["lm_head.weight"], exported["model.embed_tokens.weight"])


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_moe"])
def test_train_step_lowers_the_loss_with_the_true_gradient_norm(build: Build, kind: str) -> None:
    backend = build(kind, grad_clip=1e9)
    batch = make_batch()
    reference = hf_grad_norm(tiny_hf_model(kind), batch, TEMPERATURE)
    metrics = [backend.train_step(batch, nll_loss) for _ in range(3)]
    assert metrics[0]["actor/grad_norm"] == pytest.approx(reference, rel=1e-5)
    losses = [m["actor/loss"] for m in metrics]
    assert losses[0] > losses[1] > losses[2]
    assert metrics[-1]["actor/optimizer_step"] == 3 and metrics[-1]["actor/lr"] == 1e-2
    assert metrics[0]["test/nll"] == pytest.approx(losses[0])


def test_micro_batching_does_not_change_the_update(build: Build) -> None:
    """Micro-batches weighted by their response tokens give the full batch's token-mean gradient."""
    batch = make_batch(rows=4)
    one = build("qwen3", micro_batch_size=1)
    m1 = one.train_step(batch, nll_loss)
    after_one = _params(one)
    four = build("qwen3", micro_batch_size=4)
    m4 = four.train_step(batch, nll_loss)
    assert (m1["actor/micro_batches"], m4["actor/micro_batches"]) == (4, 1)
    assert m1["actor/grad_norm"] == pytest.approx(m4["actor/grad_norm"], rel=1e-6)
    assert m1["actor/loss"] == pytest.approx(m4["actor/loss"], rel=1e-6)
    for name, value in _params(four).items():
        torch.testing.assert_close(value, after_one[name], atol=1e-5, rtol=0)


def test_gradient_clipping_bounds_the_update(build: Build) -> None:
    batch = make_batch()
    backend = build("qwen3", grad_clip=1e-3, optim_cfg={"lr": 1e-2, "weight_decay": 0.0})
    before = _params(backend)
    metrics = backend.train_step(batch, nll_loss)
    assert metrics["actor/grad_norm"] > 1e-3 and metrics["actor/skipped_step"] == 0
    # Adam's first step moves every coordinate by ~lr regardless of scale, so compare the moment instead
    state = backend.optimizer.opt.state
    grads_sq = sum(float(s["exp_avg"].double().pow(2).sum()) for s in state.values()) / (1 - 0.9) ** 2
    assert grads_sq ** 0.5 == pytest.approx(1e-3, rel=1e-3)
    assert any(not torch.equal(before[n], p) for n, p in _params(backend).items())


def test_proximal_snapshot_swap_restores_live_weights_bit_exactly(build: Build) -> None:
    backend = build("qwen3_moe")
    batch = make_batch()
    at_sync, _ = backend.compute_log_probs(batch)
    backend.snapshot_params()
    assert backend.snapshot.nbytes == sum(p.numel() * p.element_size() for p in backend.model.parameters())
    for _ in range(2):
        backend.train_step(batch, nll_loss)
    live = _params(backend)
    current, _ = backend.compute_log_probs(batch)
    prox = backend.proximal_log_probs(batch)
    assert torch.equal(prox, at_sync)  # π_prox is exactly the policy at the last sync
    assert not torch.allclose(current, at_sync)
    for name, value in _params(backend).items():
        assert torch.equal(value, live[name]), name
    assert torch.equal(backend.compute_log_probs(batch)[0], current)
    metrics = backend.train_step(batch, nll_loss)
    assert metrics["timing_s/prox_swap"] >= 0 and metrics["timing_s/prox_log_probs"] > 0
    assert metrics["asyncrl/prox_snapshot_bytes"] == backend.snapshot.nbytes


def test_failed_proximal_forward_still_restores_the_live_weights(build: Build) -> None:
    backend = build("qwen3")
    batch = make_batch()
    backend.snapshot_params()
    backend.train_step(batch, nll_loss)
    live = _params(backend)
    broken = make_batch()
    broken.attention_mask[0, 1] = 0  # a hole in the middle of a row is rejected inside the swap
    broken.attention_mask[0, 0] = 1
    with pytest.raises(ValueError, match="contiguous"):
        backend.proximal_log_probs(broken)
    for name, value in _params(backend).items():
        assert torch.equal(value, live[name]), name


def test_proximal_log_probs_need_a_snapshot(build: Build) -> None:
    with pytest.raises(RuntimeError, match="snapshot"):
        build("qwen3").proximal_log_probs(make_batch())


def test_save_and_load_work_in_decoupled_mode(build: Build, tmp_path: Path) -> None:
    """verl #6026: with the proximal snapshot in use, checkpoint saving broke. Snapshot → train → prox →
    save → load must give an identical trainer (weights, optimizer, snapshot, next update)."""
    batch = make_batch()
    first = build("qwen3")
    first.snapshot_params()
    first.train_step(batch, nll_loss)
    prox = first.proximal_log_probs(batch)
    first.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "model.safetensors").exists()

    second = build("qwen3", optim_cfg={"lr": 1e-2})
    second.load(str(tmp_path / "ckpt"))
    for name, value in _params(first).items():
        assert torch.equal(_params(second)[name], value), name
    assert torch.equal(second.proximal_log_probs(batch), prox)
    assert second.global_step == first.global_step == 1
    assert second.load_version(str(tmp_path / "ckpt"))  # the version's weights (a resume between two syncs)
    served = []
    for backend in (first, second):  # exported with the snapshot swapped in, then the live weights back
        backend.snapshot_swap(True)
        served.append({k: v.clone() for b in backend.export_weights(2**20) for k, v in b.items()})
        backend.snapshot_swap(False)
    assert served[0].keys() == served[1].keys() and all(torch.equal(served[0][k], served[1][k]) for k in served[0])
    a, b = first.train_step(batch, nll_loss), second.train_step(batch, nll_loss)
    assert a["actor/loss"] == b["actor/loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    for name, value in _params(first).items():
        assert torch.equal(_params(second)[name], value), name


def test_context_parallel_on_cpu_is_refused_with_the_reason(hf_dirs: dict[str, Path]) -> None:
    """Before any process group: megatron-core's local attention asserts cp = 1 and TE needs CUDA."""
    with pytest.raises(ParallelConfigError, match="Transformer Engine's attention .* needs CUDA; on CPU use cp = 1"):
        MegatronTrainerBackend(str(hf_dirs["qwen3"]), cp=2, world_size=2, rank=0, master_port=1)


def test_cpu_shims_are_idempotent_and_fork_the_cpu_generator() -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from engine.trainer.megatron.shims import apply_cpu_shims

    assert apply_cpu_shims() and apply_cpu_shims()
    assert torch.cuda.current_device() == "cpu"
    tracker = get_cuda_rng_tracker()
    outer = torch.get_rng_state()
    with tracker.fork():
        inside = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer)  # the caller's stream is untouched
    with tracker.fork():
        assert not torch.equal(torch.rand(3), inside)  # the tracked stream advanced
