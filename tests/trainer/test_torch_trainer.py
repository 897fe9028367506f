"""`TorchTrainerBackend`: gradient accumulation equivalence, pre-clip grad norm, warmup, learning signal,
proximal snapshot swap, weight export."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from trainer_helpers import EOS, PAD, random_batch, seq_mean_pg_loss, token_mean_pg_loss

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.trainer.base import TrainerBackend
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Trajectory


def capture_grads(trainer: TorchTrainerBackend) -> dict[str, torch.Tensor]:
    """Record each parameter's accumulated gradient (before clipping and the optimizer step)."""
    grads: dict[str, torch.Tensor] = {}
    for name, p in trainer.model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda param, name=name: grads.__setitem__(name, param.grad.clone()))
    return grads


def make_trainer(model: torch.nn.Module, micro: int, **kw) -> TorchTrainerBackend:
    return TorchTrainerBackend(model, optim_cfg={"lr": 1e-3, "weight_decay": 0.0}, grad_clip=kw.pop("grad_clip", 1e6),
                               micro_batch_size=micro, **kw)


def test_is_a_trainer_backend(tiny_lm) -> None:
    assert isinstance(make_trainer(tiny_lm(), 4), TrainerBackend)


@pytest.mark.parametrize("loss_fn,weight_fn", [(token_mean_pg_loss, None), (seq_mean_pg_loss, lambda mb: float(len(mb)))])
def test_micro_batched_step_equals_single_batch_step(tiny_lm, loss_fn, weight_fn) -> None:
    batch = random_batch(rows=10)
    if weight_fn is not None:
        batch.meta["micro_weight_fn"] = weight_fn
    model = tiny_lm()
    whole, split = make_trainer(copy.deepcopy(model), 10), make_trainer(copy.deepcopy(model), 3)
    g_whole, g_split = capture_grads(whole), capture_grads(split)
    m_whole = whole.train_step(batch, loss_fn)
    m_split = split.train_step(batch, loss_fn)
    assert m_split["actor/micro_batches"] == 4 and m_whole["actor/micro_batches"] == 1
    assert g_whole.keys() == g_split.keys() and len(g_whole) > 0
    for name in g_whole:
        torch.testing.assert_close(g_split[name], g_whole[name], atol=1e-5, rtol=0)
    assert m_split["actor/grad_norm"] == pytest.approx(m_whole["actor/grad_norm"], abs=1e-5)
    assert m_split["actor/pg_loss"] == pytest.approx(m_whole["actor/pg_loss"], abs=1e-5)


def test_wrong_micro_weights_change_the_gradient(tiny_lm) -> None:
    """Negative control: a seq-mean loss accumulated with token-share weights is *not* the full-batch loss."""
    batch = random_batch(rows=10)
    model = tiny_lm()
    whole, split = make_trainer(copy.deepcopy(model), 10), make_trainer(copy.deepcopy(model), 3)
    g_whole, g_split = capture_grads(whole), capture_grads(split)
    whole.train_step(batch, seq_mean_pg_loss)
    split.train_step(batch, seq_mean_pg_loss)
    assert max(float((g_whole[n] - g_split[n]).abs().max()) for n in g_whole) > 1e-4


def test_grad_norm_is_logged_before_clipping_and_lr_warms_up(tiny_lm) -> None:
    trainer = TorchTrainerBackend(tiny_lm(), optim_cfg={"lr": 0.3, "warmup_steps": 3}, grad_clip=1e-3, micro_batch_size=4)
    grads = capture_grads(trainer)
    lrs = []
    for step in range(4):
        metrics = trainer.train_step(random_batch(seed=step), token_mean_pg_loss)
        lrs.append(metrics["actor/lr"])
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))
        assert metrics["actor/grad_norm"] == pytest.approx(norm, rel=1e-5)
        assert metrics["actor/grad_norm"] > 1e-3
    assert lrs == pytest.approx([0.1, 0.2, 0.3, 0.3])
    trainer.set_lr(0.05)
    assert trainer.train_step(random_batch(seed=9), token_mean_pg_loss)["actor/lr"] == pytest.approx(0.05)
    assert trainer.global_step == 5


def test_step_without_response_tokens_is_skipped(tiny_lm) -> None:
    trainer = make_trainer(tiny_lm(), 4)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    batch = random_batch()
    batch.response_mask.zero_()
    metrics = trainer.train_step(batch, token_mean_pg_loss)
    assert metrics["actor/skipped_step"] == 1.0 and trainer.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_reinforce_raises_probability_of_rewarded_tokens(tiny_lm) -> None:
    """On-policy loop sampler → reward → train_step → export → update_weights: reward = share of TARGET."""
    target = 7
    model = tiny_lm()
    trainer = TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 3e-3, "weight_decay": 0.0}, micro_batch_size=16)
    sampler = HFRolloutBackend(model, eos_token_id=EOS, pad_token_id=PAD)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 32, (4,), generator=gen).tolist() for _ in range(8)]
    probe = collate([(p, Trajectory([target], [0.0], "length", 0, 0)) for p in prompts], pad_token_id=PAD)

    def target_prob() -> float:
        return float(trainer.compute_log_probs(probe)[0][:, 0].exp().mean())

    start_prob = target_prob()
    rewards = []
    for step in range(8):
        reqs = [GenRequest(f"{i}/{j}", p, max_new_tokens=3) for i, p in enumerate(prompts) for j in range(4)]
        results = sampler.generate(reqs, SamplingParams(temperature=1.0, seed=step))
        rows = []
        for req, res in zip(reqs, results):
            reward = sum(t == target for t in res.response_ids) / 3
            rows.append((req.prompt_ids, Trajectory(res.response_ids, res.log_probs, res.finish_reason, 0, 0, reward)))
        batch = collate(rows, pad_token_id=PAD)
        r = batch.meta["rewards"].view(8, 4)
        adv = (r - r.mean(-1, keepdim=True)).view(-1)
        batch.advantages = adv[:, None] * batch.response_mask
        trainer.train_step(batch, token_mean_pg_loss)
        sampler.update_weights(trainer.export_weights(1 << 20), version=step + 1)
        rewards.append(float(r.mean()))
    end_prob = target_prob()
    assert end_prob > 3 * start_prob
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2])


def test_snapshot_swap_is_bit_exact_and_prox_log_probs_use_the_snapshot(tiny_lm) -> None:
    model = tiny_lm()
    trainer = make_trainer(copy.deepcopy(model), 4)
    reference = make_trainer(copy.deepcopy(model), 4)
    batch = random_batch()
    trainer.snapshot_params()
    trainer.train_step(batch, token_mean_pg_loss)
    live = [p.detach().clone() for p in trainer.model.parameters()]
    prox = trainer.proximal_log_probs(batch)
    assert all(torch.equal(a, b) for a, b in zip(live, trainer.model.parameters()))
    expected, _ = reference.compute_log_probs(batch)
    torch.testing.assert_close(prox, expected, atol=1e-6, rtol=0)
    current, _ = trainer.compute_log_probs(batch)
    assert float((current - expected).abs().max()) > 1e-4
    metrics = trainer.train_step(batch, token_mean_pg_loss)
    assert metrics["timing_s/prox_swap"] >= 0.0 and "timing_s/prox_log_probs" in metrics
    assert "timing_s/prox_swap" not in trainer.train_step(batch, token_mean_pg_loss)


def test_version_weights_survive_a_checkpoint_between_two_syncs(tiny_lm, tmp_path) -> None:
    """A checkpoint one step after the snapshot (a sync) holds the version's weights beside the live ones; a fresh
    backend restores both bit for bit, and exports the version's weights with the snapshot swapped in."""
    from engine.trainer.version_weights import VERSION_FILE

    model = tiny_lm()
    a = make_trainer(copy.deepcopy(model), 4)
    a.train_step(random_batch(seed=1), token_mean_pg_loss)
    a.snapshot_params()  # the sync of version v
    version = {k: v.clone() for k, v in a.full_state_dict().items()}
    a.train_step(random_batch(seed=2), token_mean_pg_loss)  # since_sync = 1
    a.save(str(tmp_path / "t"))
    assert not a.load_version(str(tmp_path / "t"))  # nothing written yet: nothing restored
    a.save_version(str(tmp_path / "t"))
    assert (tmp_path / "t" / VERSION_FILE).is_file()
    b = make_trainer(tiny_lm(), 4)
    b.load(str(tmp_path / "t"))
    assert b.load_version(str(tmp_path / "t"))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))  # live: step s
    assert all(torch.equal(x, y) for x, y in zip(a._snapshot, b._snapshot))  # snapshot: version v
    b.snapshot_swap(True)
    exported = {k: v.clone() for bucket in b.export_weights(2**20) for k, v in bucket.items()}
    b.snapshot_swap(False)
    assert exported.keys() == version.keys() and all(torch.equal(exported[k], version[k]) for k in version)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    batch = random_batch(seed=3)
    torch.testing.assert_close(b.proximal_log_probs(batch), a.proximal_log_probs(batch), atol=0, rtol=0)


def test_proximal_log_probs_needs_a_snapshot(tiny_lm) -> None:
    with pytest.raises(RuntimeError):
        make_trainer(tiny_lm(), 4).proximal_log_probs(random_batch())


def test_export_weights_buckets_are_hf_named_zero_copy_views_in_the_model_dtype(tiny_lm) -> None:
    trainer = make_trainer(tiny_lm(), 4)
    state = trainer.model.state_dict()
    buckets = list(trainer.export_weights(bucket_bytes=100_000))
    names = [n for b in buckets for n in b]
    assert names == list(state) and "lm_head.weight" in names
    for b in buckets:
        total = sum(a.nbytes for a in b.values())
        assert total <= 100_000 or len(b) == 1
    exported = {n: a for b in buckets for n, a in b.items()}
    for name, tensor in state.items():
        assert exported[name].dtype == tensor.dtype and torch.equal(exported[name], tensor)
        assert exported[name].data_ptr() == tensor.data_ptr(), f"{name} was copied (a sync pays every copy)"
    bf16 = make_trainer(tiny_lm().to(torch.bfloat16), 4)
    assert {a.dtype for b in bf16.export_weights(1 << 20) for a in b.values()} == {torch.bfloat16}  # not widened


def test_full_state_dict_takes_the_module_state_dict_only_where_it_is_the_same(tiny_lm) -> None:
    """After its first call has checked them equal, `full_state_dict` of a plain module is its own `state_dict`
    (cheaper than `get_model_state_dict`): the same names, order and tensors, also after a step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    trainer = make_trainer(tiny_lm(), 4)

    def reference() -> dict:
        return get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    first = trainer.full_state_dict()
    assert trainer._plain_state is True
    for _ in range(2):
        again = trainer.full_state_dict()
        ref = reference()
        assert list(again) == list(first) == list(ref) + [k for k in again if k not in ref]
        for k, t in ref.items():
            assert again[k].data_ptr() == t.data_ptr() and torch.equal(again[k], t)
            assert not again[k].requires_grad
        trainer.train_step(random_batch(4), token_mean_pg_loss)

    class Wrapped(torch.nn.Module):  # names that differ from the checkpoint's: get_model_state_dict stays
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    from engine.trainer.torch_weights import _same_tensors

    w = Wrapped(torch.nn.Linear(2, 2))
    assert _same_tensors(w.state_dict(), w.state_dict())
    assert not _same_tensors({"weight": w.inner.weight.detach()}, w.state_dict())
    assert not _same_tensors({k: v.clone() for k, v in w.state_dict().items()}, w.state_dict())


class EntropyBonusLoss:
    """−mean entropy: only the entropy term carries gradient; flags itself with `needs_entropy`."""

    needs_entropy = True

    def __call__(self, log_probs, entropy, mb):
        mask = mb.response_mask
        return -(entropy * mask).sum() / mask.sum(), {}


def test_entropy_mode_controls_what_the_loss_receives(tiny_lm) -> None:
    seen = {}

    def probe(log_probs, entropy, mb):
        seen["entropy"] = entropy
        return token_mean_pg_loss(log_probs, entropy, mb)

    make_trainer(tiny_lm(), 16, entropy="none").train_step(random_batch(), probe)
    assert seen["entropy"] is None
    make_trainer(tiny_lm(), 16).train_step(random_batch(), probe)
    assert seen["entropy"] is not None and not seen["entropy"].requires_grad
    trainer = make_trainer(tiny_lm(), 16)
    metrics = trainer.train_step(random_batch(), EntropyBonusLoss())
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/skipped_step"] == 0.0
