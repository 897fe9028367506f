"""Issue 23 on the Megatron backend (one gloo rank, dense and MoE): activation recompute and the chunked
log-prob head leave the loss, the gradient norm and the weights after two updates equal to the plain path's;
the reference is frozen (no DDP wrapper, no optimizer, no gradients); bf16 compute keeps fp32 main params."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from megatron_helpers import make_batch, nll_loss

from engine.trainer.megatron.backend import MegatronTrainerBackend

pytestmark = pytest.mark.usefixtures("process_group")

Build = Callable[..., MegatronTrainerBackend]


@pytest.fixture
def build(hf_dirs: dict[str, Path]) -> Build:
    def _build(kind: str, **kw: object) -> MegatronTrainerBackend:
        kw = {"optim_cfg": {"lr": 1e-2}, "micro_batch_size": 2, "temperature": 0.7, "grad_clip": 1e9} | kw
        return MegatronTrainerBackend(str(hf_dirs[kind]), **kw)

    return _build


def _two_updates(backend: MegatronTrainerBackend) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    batch = make_batch(rows=4, response=6)
    metrics = [backend.train_step(batch, nll_loss) for _ in range(2)]
    return metrics, {n: p.detach().clone() for n, p in backend.model.named_parameters()}


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
@pytest.mark.parametrize("mode", [{"recompute_granularity": "full", "recompute_num_layers": 1},
                                  {"recompute_granularity": "full", "recompute_method": "block"},
                                  {"recompute_granularity": "selective"},
                                  {"logprob_chunk_tokens": 4}],
                         ids=["full-uniform", "full-block", "selective", "chunked-head"])
def test_memory_mode_equals_the_plain_path_after_two_updates(build: Build, kind: str, mode: dict) -> None:
    plain_metrics, plain = _two_updates(build(kind))
    metrics, weights = _two_updates(build(kind, **mode))
    for a, b in zip(plain_metrics, metrics):
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
    for name, value in plain.items():
        torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=1e-5)
    assert plain_metrics[1]["actor/loss"] < plain_metrics[0]["actor/loss"]  # the updates did something


def test_the_reference_is_frozen_and_gives_the_policys_log_probs(build: Build) -> None:
    batch = make_batch()
    policy = build("qwen3_moe")
    ref = build("qwen3_moe", frozen=True)
    assert ref.optimizer is None and ref.ddp is ref.model  # no DDP wrapper, no gradient buffers
    assert not any(p.requires_grad for p in ref.model.parameters())
    expected, _ = policy.compute_log_probs(batch)
    got, _ = ref.compute_log_probs(batch)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert not got.requires_grad
    with pytest.raises(RuntimeError, match="frozen"):
        ref.train_step(batch, nll_loss)


def test_bf16_compute_updates_fp32_main_params_that_a_bf16_optimizer_would_lose(build: Build) -> None:
    """lr 1e-6 (the presets'): fp32 main params accumulate the update; a pure-bf16 AdamW rounds most of it away."""
    batch = make_batch()
    settings = {"optim_cfg": {"lr": 1e-6, "weight_decay": 0.0}, "dtype": "bfloat16"}
    master = build("qwen3", **settings)
    pure = build("qwen3", fp32_master_weights=False, **settings)
    assert {p.dtype for p in master.model.parameters()} == {torch.bfloat16}
    assert {m.dtype for m in master.optimizer.mains} == {torch.float32}
    before = [m.clone() for m in master.optimizer.mains]
    pure_before = [p.detach().clone() for p in pure.optimizer.params]
    master.train_step(batch, nll_loss)
    pure.train_step(batch, nll_loss)
    moved = sum(int((m != b).sum()) for m, b in zip(master.optimizer.mains, before))
    pure_moved = sum(int((p.detach() != b).sum()) for p, b in zip(pure.optimizer.params, pure_before))
    total = sum(b.numel() for b in before)
    assert moved / total > 0.95
    assert pure_moved / total < 0.2


def test_fp32_main_params_survive_a_checkpoint(build: Build, tmp_path: Path) -> None:
    """The bf16 weights alone would lose the masters' low bits: `save` writes the masters, `load` restores them."""
    batch = make_batch()
    settings = {"optim_cfg": {"lr": 1e-6, "weight_decay": 0.0}, "dtype": "bfloat16"}
    trained = build("qwen3", **settings)
    trained.train_step(batch, nll_loss)
    trained.save(str(tmp_path / "ckpt"))
    resumed = build("qwen3", **settings)
    resumed.load(str(tmp_path / "ckpt"))
    for a, b in zip(trained.optimizer.mains, resumed.optimizer.mains):
        assert torch.equal(a, b)
    assert any(not torch.equal(m, p.detach().float()) for m, p in zip(resumed.optimizer.mains, resumed.optimizer.params))
