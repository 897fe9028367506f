"""Issue 23 on the torch backend (one process, dense and MoE): gradient checkpointing and the chunked log-prob
head leave the loss, the gradient norm and the weights after two updates equal to the plain path's; the
reference is frozen; fp32 master weights under bf16 compute move the weights that a pure-bf16 AdamW cannot."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import build_tiny_lm, build_tiny_moe_lm, random_batch, token_mean_pg_loss

from engine.trainer.torch_trainer import TorchTrainerBackend

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}  # ε damps Adam's ±lr on ~0 gradients (rounding noise)
BUILDERS = {"dense": build_tiny_lm, "moe": build_tiny_moe_lm}


def make(model: torch.nn.Module, **kw: object) -> TorchTrainerBackend:
    kw = {"optim_cfg": OPTIM, "grad_clip": 1e6, "micro_batch_size": 4} | kw
    return TorchTrainerBackend(model, **kw)


def two_updates(trainer: TorchTrainerBackend) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    batch = random_batch(rows=8, max_response=9)
    metrics = [trainer.train_step(batch, token_mean_pg_loss) for _ in range(2)]
    return metrics, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("mode", [{"gradient_checkpointing": True}, {"logprob_chunk_tokens": 5},
                                  {"gradient_checkpointing": True, "logprob_chunk_tokens": 3}],
                         ids=["checkpointing", "chunked-head", "both"])
def test_memory_mode_equals_the_plain_path_after_two_updates(kind: str, mode: dict) -> None:
    model = BUILDERS[kind]()
    plain_metrics, plain = two_updates(make(copy.deepcopy(model)))
    metrics, weights = two_updates(make(model, **mode))
    for a, b in zip(plain_metrics, metrics):
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5, abs=1e-7)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
        assert b["actor/entropy"] == pytest.approx(a["actor/entropy"], rel=1e-5)
    for name, value in plain.items():
        torch.testing.assert_close(weights[name], value, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(v, p) for v, p in zip(plain.values(), BUILDERS[kind]().parameters()))


def test_chunked_head_never_holds_all_the_logits() -> None:
    """The head's logits tensor is [chunk, V], not [B·R, V]: record the largest tensor the output layer makes."""
    model = build_tiny_lm()
    sizes: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: sizes.append(out.shape[0] * out.shape[1]))
    batch = random_batch(rows=8, max_response=9)
    trainer = make(model, logprob_chunk_tokens=5)
    trainer.compute_log_probs(batch)
    logits_rows = []
    orig = torch.nn.functional.linear

    def spy(x, w, b=None):  # the chunked head's projections
        out = orig(x, w, b)
        if w is model.lm_head.weight:
            logits_rows.append(out.reshape(-1, out.shape[-1]).shape[0])
        return out

    torch.nn.functional.linear = spy
    try:
        trainer.compute_log_probs(batch)
    finally:
        torch.nn.functional.linear = orig
    assert logits_rows and max(logits_rows) <= 5
    assert sum(logits_rows) == batch.responses.numel()


def test_the_reference_is_frozen_and_gives_the_policys_log_probs() -> None:
    batch = random_batch(rows=8)
    policy = make(build_tiny_lm())
    ref = make(build_tiny_lm(), frozen=True, param_offload=True)  # offload is a no-op on CPU
    assert ref.optimizer is None and not any(p.requires_grad for p in ref.model.parameters())
    expected, _ = policy.compute_log_probs(batch)
    got, _ = ref.compute_log_probs(batch)
    # the same weights and the same math; not bit-exact: the two instances may split a reduction differently
    # across intra-op threads (1 ulp, 9.5e-7, seen under load)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="frozen"):
        ref.train_step(batch, token_mean_pg_loss)


def test_fp32_master_weights_move_at_lr_1e6_where_pure_bf16_does_not() -> None:
    """The presets' lr: with fp32 masters under bf16 compute nearly every weight changes; a pure-bf16 AdamW
    rounds most updates (≈ lr = 1e-6 ≪ half an ulp of a 0.1-sized weight) away."""
    batch = random_batch(rows=8)
    model = build_tiny_lm()
    optim = {"lr": 1e-6, "weight_decay": 0.0}
    master = make(copy.deepcopy(model), optim_cfg=optim, precision="bf16", logprob_chunk_tokens=4)
    pure = make(copy.deepcopy(model).to(torch.bfloat16), optim_cfg=optim, precision="bf16")
    assert master._autocast() and not pure._autocast()

    def changed(trainer: TorchTrainerBackend) -> float:
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train_step(batch, token_mean_pg_loss)
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(trainer.model.parameters(), before))
        return moved / sum(b.numel() for b in before)

    assert changed(master) > 0.95
    assert changed(pure) < 0.2
