"""The back buffer of a staged weight sync (`engine.sync.staging`): staging never touches the live weights, the
swap makes exactly what was sent live (tied weights once, a tensor not sent keeps its live value, a fused
expert tensor written in parts gets those parts), the old storage serves the next version, and a swap of a
version that was not staged is refused."""

from __future__ import annotations

import pytest
import torch

from engine.sync.flat import flatten
from engine.sync.staging import BackBuffer, weights_nbytes


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.body = torch.nn.Linear(6, 6)
        self.norm = torch.nn.LayerNorm(6)  # never sent below: must keep its live value
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight


def snapshot(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def sent(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"embed.weight": torch.randn(11, 6, generator=g), "body.weight": torch.randn(6, 6, generator=g),
            "body.bias": torch.randn(6, generator=g)}


def test_stage_leaves_the_live_weights_and_swap_makes_what_was_sent_live() -> None:
    torch.manual_seed(0)
    model = Tied()
    live_before = snapshot(model)
    back = BackBuffer(model)
    assert weights_nbytes(model) == sum(p.numel() * 4 for p in model.parameters())  # the tied weight once
    for version in (1, 2, 3):  # the old storage is the next back buffer: three versions through two copies
        before = snapshot(model)
        want = sent(version)
        buckets = [flatten(want, 0), flatten({"head.weight": want["embed.weight"]}, 1)]  # tied: sent twice
        copied = back.stage(buckets, version)
        assert copied == sum(t.numel() * 4 for t in want.values()) + want["embed.weight"].numel() * 4
        assert all(torch.equal(before[k], v) for k, v in snapshot(model).items())  # nothing live changed
        assert back.staged == version
        back.swap(version)
        now = snapshot(model)
        for name, t in want.items():
            assert torch.equal(now[name], t), name
        assert torch.equal(now["head.weight"], want["embed.weight"])
        assert model.head.weight is model.embed.weight  # still tied
        assert torch.equal(now["norm.weight"], live_before["norm.weight"])  # not sent: untouched
        assert torch.equal(now["norm.bias"], live_before["norm.bias"])
        assert back.staged is None
    with pytest.raises(RuntimeError, match="staged nothing, cannot swap in v4"):
        back.swap(4)
    back.stage([flatten(sent(5), 0)], 5)
    with pytest.raises(RuntimeError, match="staged v5, cannot swap in v6"):
        back.swap(6)


def test_a_fused_expert_tensor_written_in_parts_gets_only_those_parts() -> None:
    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.randn(3, 8, 5))
            self.down_proj = torch.nn.Parameter(torch.randn(3, 5, 4))

    class Moe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = torch.nn.Module()
            self.mlp.experts = Experts()

    torch.manual_seed(1)
    model = Moe()
    live = snapshot(model)
    back = BackBuffer(model)
    gate1, up1 = torch.full((4, 5), 7.0), torch.full((4, 5), 9.0)
    back.stage([{"mlp.experts.1.gate_proj.weight": gate1, "mlp.experts.1.up_proj.weight": up1}], 1)
    back.swap(1)
    now = snapshot(model)
    fused = now["mlp.experts.gate_up_proj"]
    assert torch.equal(fused[1, :4], gate1) and torch.equal(fused[1, 4:], up1)
    assert torch.equal(fused[0], live["mlp.experts.gate_up_proj"][0])  # experts not sent keep their values
    assert torch.equal(fused[2], live["mlp.experts.gate_up_proj"][2])
    assert torch.equal(now["mlp.experts.down_proj"], live["mlp.experts.down_proj"])
    # every expert sent: the fused tensors are swapped whole
    want_gu, want_d = torch.randn(3, 8, 5), torch.randn(3, 5, 4)
    bucket = {}
    for e in range(3):
        bucket[f"mlp.experts.{e}.gate_proj.weight"] = want_gu[e, :4]
        bucket[f"mlp.experts.{e}.up_proj.weight"] = want_gu[e, 4:]
        bucket[f"mlp.experts.{e}.down_proj.weight"] = want_d[e]
    back.stage([flatten(bucket, 0)], 2)
    back.swap(2)
    assert torch.equal(model.mlp.experts.gate_up_proj.detach(), want_gu)
    assert torch.equal(model.mlp.experts.down_proj.detach(), want_d)


def test_auto_allocates_the_back_buffer_only_where_twice_the_weights_are_free() -> None:
    from engine.runtime.replica import back_buffer_fits, free_memory

    free = free_memory("cpu")
    assert free > 0
    assert back_buffer_fits(min(2**20, free // 4), "cpu") is (free >= 2**20 + 2**30)
    assert back_buffer_fits(free, "cpu") is False  # the copy itself would take all that is free
    assert back_buffer_fits(free // 2 + 1, "cpu") is False  # fits, but nothing as large would be left


class Big(torch.nn.Module):
    """Tensors above the kernel's sample chunk (~900 KiB) and its streaming threshold, in two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 300)  # 1.2 MB fp32, tied below
        self.body = torch.nn.Linear(300, 1111)  # 1.33 MB weight + a small bias
        self.head = torch.nn.Linear(300, 1000, bias=False)
        self.head.weight = self.embed.weight
        self.low = torch.nn.Parameter(torch.zeros(777, 601, dtype=torch.bfloat16))  # ~0.93 MB bf16
        self.norm = torch.nn.LayerNorm(300)  # never sent: read after the swap


def test_the_weight_sample_taken_while_staging_equals_the_one_read_after_the_swap() -> None:
    """The sums the stage takes while it copies (the native load) give the very fingerprint a full read of the
    live weights gives after the swap; a tensor written another way (here in another dtype) or not sent is
    read; the sums serve the first fingerprint after the swap only."""
    from engine.sync import native
    from engine.sync.verify import weights_fingerprint

    torch.manual_seed(0)
    model = Big()
    back = BackBuffer(model)
    for version in (1, 2, 3):
        g = torch.Generator().manual_seed(version)
        want = {"embed.weight": torch.randn(1000, 300, generator=g), "body.weight": torch.randn(1111, 300, generator=g),
                "low": torch.randn(777, 601, generator=g).to(torch.bfloat16),
                "body.bias": torch.randn(1111, generator=g, dtype=torch.float64)}  # another dtype: general copy
        buckets = [flatten({k: want[k] for k in ("low", "body.bias")}, 0),
                   flatten({"embed.weight": want["embed.weight"], "body.weight": want["body.weight"]}, 1),
                   flatten({"head.weight": want["embed.weight"]}, 2)]
        back.stage(buckets, version)
        back.swap(version)
        known = back.take_samples()
        assert back.take_samples() is None  # once
        full = weights_fingerprint(model.state_dict().values())
        assert weights_fingerprint(model.state_dict().values(), known) == full
        if native.kernel() is not None:  # the sums were taken: the big tensors are not read again
            assert {model.embed.weight.data_ptr(), model.body.weight.data_ptr(), model.low.data_ptr()} <= set(known)
            assert model.body.bias.data_ptr() not in known and model.norm.weight.data_ptr() not in known
