"""The rehearsal's node host-memory check (`engine.rehearse.nodes`): a node's host peak is the sum of its trainer
ranks' host peaks, checked against the hardware preset's node RAM, failing in one line that names the node, the
role and the rank; every accelerator hardware preset declares that RAM."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

from engine.rehearse.nodes import class_ranks, node_host
from engine.rehearse.report import RankClass

ROOT = Path(__file__).resolve().parents[2]
GB = 10**9


def _plan(world: int, per_node: int, ram_gb: float | None) -> SimpleNamespace:
    hardware = SimpleNamespace(name="h100", host_memory_gb=ram_gb)
    resources = SimpleNamespace(trainer=SimpleNamespace(gpus_per_node=per_node))
    return SimpleNamespace(config=SimpleNamespace(resources=resources), hardware=hardware, trainer_ranks=world)


def _classes() -> list[RankClass]:
    writer = RankClass("rank 0", "0", 0, host_start=35 * GB, host_resident=10 * GB, host_save=61 * GB)
    others = RankClass("others", "1-15", 1, host_resident=10 * GB)
    return [writer, others]


def test_class_ranks_reads_ranges_and_lists() -> None:
    assert class_ranks(RankClass("x", "0", 0)) == [0]
    assert class_ranks(RankClass("x", "1-3,7", 1)) == [1, 2, 3, 7]


def test_node_sums_its_ranks_peaks_and_fits() -> None:
    nodes, failures = node_host(_plan(16, 8, 2048), _classes())
    assert not failures
    # rank 0: max(35, 10 + 61) = 71 GB; ranks 1-7: 10 GB each; node 1: ranks 8-15, 10 GB each
    assert [(n["node"], n["ranks"], n["host_peak"]) for n in nodes] == [(0, "0-7", 141 * GB), (1, "8-15", 80 * GB)]
    assert all(n["fits"] for n in nodes) and nodes[0]["host_memory"] == 2048 * GB


def test_node_over_its_ram_fails_naming_node_role_and_rank() -> None:
    _, failures = node_host(_plan(16, 8, 100), _classes())
    assert len(failures) == 1
    f = failures[0]
    assert (f.role, f.rank, f.phase) == ("trainer", 0, "node host memory")
    assert f.line().startswith("trainer rank 0 (node host memory): node 0 (trainer ranks 0-7) holds 141.0 GB")
    assert "over the 100 GB of a h100 node" in f.line()


def test_hardware_without_node_ram_is_reported_not_checked() -> None:
    nodes, failures = node_host(_plan(16, 8, None), _classes())
    assert not failures and nodes[0]["fits"] is None and nodes[0]["host_memory"] is None


def test_every_accelerator_preset_declares_its_node_ram() -> None:
    for path in sorted((ROOT / "presets" / "hardware").glob("*.toml")):
        preset = tomllib.loads(path.read_text())
        if preset["device"] != "cpu":
            assert preset.get("host_memory_gb", 0) >= 512, path.name
            assert "# node host RAM:" in path.read_text(), f"{path.name}: the figure's source"
