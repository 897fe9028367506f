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
