"""The Megatron rehearsal's pieces that need no model: the layer extrapolation, RoPE's CP selection stand-in
(the same two chunks megatron-core selects), the ring-attention stand-in's shapes on fake tensors, and the
coalesced collectives on fake tensors over the fake group (fast)."""

from __future__ import annotations

import torch

from engine.rehearse.fake import coalesced_collectives_on_fake_tensors, fake_mode, fake_world
from engine.rehearse.megatron_standins import cp_rotary_selection
from engine.rehearse.megatron_step import extrapolate


def test_extrapolation_is_linear_in_layers_per_phase_and_category() -> None:
    one = {"update": (10, {"weights": 4, "activations": 6}), "optimizer step": (7, {"optimizer": 7})}
    two = {"update": (13, {"weights": 6, "activations": 7}), "optimizer step": (9, {"optimizer": 9})}
    out = extrapolate(one, two, 48)
    assert out["update"] == (10 + 47 * 3, {"weights": 4 + 47 * 2, "activations": 6 + 47})
    assert out["optimizer step"] == (7 + 47 * 2, {"optimizer": 7 + 47 * 2})


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_rotary_selection_keeps_chunks_r_and_2cp_minus_1_minus_r() -> None:
    emb = torch.arange(16.0).view(16, 1, 1, 1)  # 16 positions, cp = 2: 4 chunks of 4
    got = cp_rotary_selection(emb, 0, _Group(2, 1)).flatten().tolist()
    assert got == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert cp_rotary_selection(emb, 0, _Group(2, 0)).flatten().tolist() == [0, 1, 2, 3, 12, 13, 14, 15]


def test_coalesced_all_reduce_runs_on_fake_tensors_over_the_fake_group() -> None:
    import torch.distributed as dist

    coalesced_collectives_on_fake_tensors()
    with fake_world(3, 16), fake_mode():
        a, b = torch.empty(1 << 20), torch.empty(1 << 10)
        with dist._coalescing_manager(dist.group.WORLD):
            dist.all_reduce(a)
            dist.all_reduce(b)
        assert a.shape == (1 << 20,)


def test_flash_attention_is_stood_in_at_cp_1_only_when_the_run_uses_it(monkeypatch) -> None:
    """`trainer.use_flash_attn` on CUDA: Transformer Engine's flash attention at every cp, so the rehearsal's
    CPU build gets the flash-style stand-in at cp = 1 too (the local attention would keep S × S scores); a run
    without it keeps the local attention; the build function is restored after."""
    from types import SimpleNamespace

    from engine.rehearse.megatron_standins import RingAttentionStandIn, megatron_stand_ins
    from engine.trainer.megatron import model as model_module

    def local_block_spec(config: object, te_attention: bool = False) -> SimpleNamespace:
        layer = SimpleNamespace(submodules=SimpleNamespace(
            self_attention=SimpleNamespace(submodules=SimpleNamespace(core_attention="local"))))
        return SimpleNamespace(layer_specs=[layer, layer])

    monkeypatch.setattr(model_module, "layer_block_spec", local_block_spec)
    core = lambda block: {s.submodules.self_attention.submodules.core_attention for s in block.layer_specs}  # noqa: E731
    with megatron_stand_ins(flash=True) as stand_ins:
        assert core(model_module.layer_block_spec(None)) == {RingAttentionStandIn}
        assert "flash attention" in stand_ins
    with megatron_stand_ins() as stand_ins:
        assert core(model_module.layer_block_spec(None)) == {"local"} and "flash attention" not in stand_ins
    assert model_module.layer_block_spec is local_block_spec
