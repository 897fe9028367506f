"""Megatron model settings that change what is computed (`engine.config.megatron_model`), on CPU with real
megatron-core over gloo: the MoE router's load-balancing and z-losses (their metrics equal the formulas on the
HF router's logits, their gradient is the HF gradient of NLL + coeff · loss, and a coefficient of 0 — or
verl's load-balancing type "none" — adds nothing), and uneven pipeline stages (each stage builds the stated layer
count with the right global layer numbers, and computes what the HF checkpoint computes — also with token-budget
micro-batches of different shapes, `use_dynamic_bsz`, which the pipeline sends with their own shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_helpers import (VOCAB, as_tensor, assert_exports_checkpoint, hf_grad_norm, hf_log_probs, make_batch,
                              nll_loss, spawn)
from megatron_workers import TEMPERATURE, uneven_pipeline_rank

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(300)]
AUX, Z = 0.1, 0.01


def tiny_moe(layers: int = 2) -> torch.nn.Module:
    """A random tiny Qwen3-MoE: every layer routed (4 experts, top 2)."""
    import transformers as tf

    torch.manual_seed(0)
    return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, initializer_range=0.2, max_position_embeddings=128,
        moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)).eval()


def tiny_dense() -> torch.nn.Module:
    """A random tiny 3-layer Qwen3."""
    import transformers as tf

    torch.manual_seed(0)
    return tf.Qwen3ForCausalLM(tf.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, initializer_range=0.2, max_position_embeddings=128)).eval()


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("moe")
    tiny_moe().save_pretrained(d)
    return d


def hf_router_losses(model: torch.nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(NLL, load-balancing loss, z-loss) on the HF model with grad; the router losses over the real tokens,
    per layer and averaged over the layers: lb = E · Σ_e f_e · P_e (f_e the share of the k·T routed slots, P_e the
    mean router probability), z = mean_t logsumexp(logits_t)²."""
    logits: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(
        lambda m, i, o: logits.append(torch.nn.functional.linear(i[0].float(), m.weight.float())))
        for layer in model.model.layers]
    try:
        lp, _ = hf_log_probs(model, batch, TEMPERATURE, grad=True)
    finally:
        for h in hooks:
            h.remove()
    nll, _ = nll_loss(lp, None, batch)
    real = batch.attention_mask.reshape(-1).bool()
    experts, k = model.config.num_experts, model.config.num_experts_per_tok
    lbs, zs = [], []
    for lg in logits:
        lg = lg[real]
        probs = torch.softmax(lg, dim=-1)
        routed = torch.zeros_like(probs).scatter(1, probs.topk(k, dim=1).indices, 1.0)
        tokens = lg.shape[0]
        lbs.append(experts * ((routed.sum(0) / (tokens * k)) * probs.mean(0)).sum())
        zs.append(torch.logsumexp(lg, dim=-1).square().mean())
    return nll, torch.stack(lbs), torch.stack(zs)


def _backend(directory: Path, **settings):
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    return MegatronTrainerBackend(str(directory), optim_cfg={"lr": 1e-2}, micro_batch_size=8,
                                  temperature=TEMPERATURE, grad_clip=1e9, **settings)


def _grad_norm(model: torch.nn.Module, loss: torch.Tensor) -> float:
    model.zero_grad()
    loss.backward()
    total = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    model.zero_grad()
    return total ** 0.5


def test_moe_aux_and_z_loss_metrics_and_gradient_follow_their_formulas(moe_dir: Path, process_group: None) -> None:
    batch = make_batch()
    nll, lb, z = hf_router_losses(tiny_moe(), batch)
    on = _backend(moe_dir, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=AUX, moe_z_loss_coeff=Z)
    metrics = on.train_step(batch, nll_loss)
    assert metrics["actor/load_balancing_loss"] == pytest.approx(float(lb.mean().detach()), rel=1e-4)
    assert metrics["actor/z_loss"] == pytest.approx(float(z.mean().detach()), rel=1e-4)
    assert metrics["actor/load_balancing_loss"] > 0 and metrics["actor/z_loss"] > 0
    model = tiny_moe()
    nll, lb, z = hf_router_losses(model, batch)
    with_aux = _grad_norm(model, nll + AUX * lb.sum() + Z * z.sum())
    nll, _, _ = hf_router_losses(model, batch)
    without = _grad_norm(model, nll)
    assert metrics["actor/grad_norm"] == pytest.approx(with_aux, rel=1e-5)
    assert abs(with_aux - without) > 1e-4 * without  # the auxiliary terms move the gradient

    off = _backend(moe_dir, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.0)
    plain = off.train_step(batch, nll_loss)
    assert plain["actor/grad_norm"] == pytest.approx(without, rel=1e-5)
    assert "actor/load_balancing_loss" not in plain and "actor/z_loss" not in plain
    # verl's setting: load-balancing type "none" — the coefficient alone has no effect (in verl as here)
    none = _backend(moe_dir, moe_aux_loss_coeff=AUX)
    assert none.train_step(batch, nll_loss)["actor/grad_norm"] == pytest.approx(without, rel=1e-5)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    d = tmp_path_factory.mktemp("moe3")
    tiny_moe(layers=3).save_pretrained(d)
    tiny_dense().save_pretrained(d / "dense")
    return d, spawn(uneven_pipeline_rank, 2, str(d), 1, str(d / "dense"), timeout=280)


@pytest.mark.slow  # two spawned gloo ranks: ~55 s on the 2-core CI machine
def test_uneven_pipeline_stages_build_the_stated_layers_and_compute_the_checkpoint(uneven) -> None:
    directory, ranks = uneven
    assert [r["layers"] for r in ranks] == [1, 2]
    assert [list(r["layer_numbers"]) for r in ranks] == [[1], [2, 3]]  # Megatron's global, 1-based numbers
    batch = make_batch()
    ref, _ = hf_log_probs(tiny_moe(layers=3), batch, TEMPERATURE)
    for r in ranks:
        torch.testing.assert_close(as_tensor(r["log_probs"]), ref, atol=1e-5, rtol=0)
        assert_exports_checkpoint(r["export"], directory)
    # the auxiliary losses over the pipeline: every MoE layer's router, whichever stage holds it, per
    # micro-batch (2 rows each), averaged over the micro-batches; their gradient scaled 1 / K
    model = tiny_moe(layers=3)
    nll, _, _ = hf_router_losses(model, batch)
    halves = [hf_router_losses(model, batch.select(torch.arange(i, i + 2)))[1:] for i in (0, 2)]
    lb = sum(h[0] for h in halves) / 2
    z = sum(h[1] for h in halves) / 2
    expected = _grad_norm(model, nll + AUX * lb.sum() + Z * z.sum())
    for r in ranks:
        assert float(r["metrics"]["actor/load_balancing_loss"]) == pytest.approx(float(lb.mean().detach()), rel=1e-4)
        assert float(r["metrics"]["actor/z_loss"]) == pytest.approx(float(z.mean().detach()), rel=1e-4)
        assert float(r["metrics"]["actor/grad_norm"]) == pytest.approx(expected, rel=1e-4)
    # a dense model's token-budget micro-batches, each its own shape through the pipeline: the HF log-probs (in
    # row order) and the whole batch's NLL gradient
    dense = tiny_dense()
    ref, _ = hf_log_probs(dense, batch, TEMPERATURE)
    expected = hf_grad_norm(dense, batch, TEMPERATURE)
    for r in ranks:
        torch.testing.assert_close(as_tensor(r["dynamic_log_probs"]), ref, atol=1e-5, rtol=0)
        assert float(r["dynamic_metrics"]["actor/grad_norm"]) == pytest.approx(expected, rel=1e-4)
