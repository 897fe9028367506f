"""The placement formula (`engine.plan.layout`) that both `launch --dry-run` and the driver use."""

from __future__ import annotations

import pytest

from engine.plan.layout import LayoutError, pool_layout, run_layout


def test_seed000_layout_96_32() -> None:
    pools = run_layout(4, 8, 2, 12, 8, 24, 4)
    t, r = pools["trainer"], pools["rollout"]
    assert t.node_bundles == (8, 8, 8, 8) and r.node_bundles == (8,) * 12
    assert [s.node for s in t.slots] == [rank // 8 for rank in range(32)]
    assert t.slots[9].bundles == (1,)
    assert r.slots[0].bundles == (0, 1, 2, 3) and r.slots[1].bundles == (4, 5, 6, 7)
    assert [s.node for s in r.slots] == [i // 2 for i in range(24)]
    for tp_group in range(16):  # Megatron's TP groups (ranks 2g, 2g+1) never span nodes
        assert t.slots[2 * tp_group].node == t.slots[2 * tp_group + 1].node


def test_fewer_replicas_reserve_only_the_nodes_they_use() -> None:
    r = pool_layout("rollout", 3, 8, 3, unit=4)
    assert r.node_bundles == (8, 4) and r.slots[2].node == 1


@pytest.mark.parametrize(("args", "why"), [
    (("rollout", 2, 8, 1, 16, 1), "does not fit a node of 8"),  # a replica wider than a node
    (("trainer", 2, 6, 12, 1, 4), "would span nodes"),  # TP 4 groups over 6-GPU nodes
    (("rollout", 1, 8, 3, 4, 1), "do not fit 1 node"),
])
def test_layouts_that_cannot_be_placed_are_refused_with_the_key(args: tuple, why: str) -> None:
    with pytest.raises(LayoutError, match=why) as e:
        pool_layout(*args)
    assert str(e.value).startswith(f"resources.{args[0]}.gpus_per_node")
