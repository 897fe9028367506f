"""A weight-sync transport exists on every device a preset can name: every shipped run preset's resolved
transport is built for its device, the HCCL group on NPU is constructed the way torch_npu's binding takes it,
and `validate` refuses a transport the device does not have (no accelerator needed)."""

from __future__ import annotations

import datetime as dt
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from asyncrl_cli.config.loader import analyze_run_config
from engine.plan.devices import COLLECTIVE_BACKEND, WEIGHT_SYNC_TRANSPORTS, weight_sync_transport
from engine.sync import collective
from engine.sync.collective import BroadcastGroup, CollectiveSync
from engine.sync.object_store import ObjectStoreSync
from engine.sync.runtime import COLLECTIVE_DEVICES, weight_transport

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "presets" / "runs").glob("*.toml"))
SEED_002 = ROOT / "presets" / "runs" / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml"


def test_the_plan_and_the_sync_package_agree_on_which_devices_have_a_collective():
    assert set(COLLECTIVE_DEVICES) == {d for d, ts in WEIGHT_SYNC_TRANSPORTS.items() if "collective" in ts}
    assert set(COLLECTIVE_BACKEND) == set(WEIGHT_SYNC_TRANSPORTS)
    assert set(COLLECTIVE_BACKEND.values()) <= set(collective.BACKENDS)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_shipped_preset_resolves_to_a_transport_that_exists_on_its_device(preset: Path):
    an = analyze_run_config(preset)
    assert an.config is not None and an.hardware is not None, [str(p) for p in an.problems]
    device = an.hardware.device
    kind = weight_sync_transport(an.config, device)
    assert not [p for p in an.problems if p.code == "weight-sync-transport"]
    if kind == "shared_memory":
        assert device == "cpu"
        return
    sync = weight_transport(kind, device, COLLECTIVE_BACKEND[device], "127.0.0.1", 1, receivers=2)
    assert isinstance(sync, CollectiveSync if kind == "collective" else ObjectStoreSync)
    if kind == "collective":
        assert sync.backend == COLLECTIVE_BACKEND[device] in collective.BACKENDS


def test_seed_002_syncs_over_hccl():
    an = analyze_run_config(SEED_002)
    assert an.config is not None and an.hardware is not None and an.hardware.device == "npu"
    sync = weight_transport(weight_sync_transport(an.config, "npu"), "npu", COLLECTIVE_BACKEND["npu"],
                            "127.0.0.1", 1, receivers=16)
    assert isinstance(sync, CollectiveSync) and sync.backend == "hccl" and sync.world == 17


class _Options:
    """torch_npu's `ProcessGroupHCCL.Options` (a pybind class with a `_timeout` attribute)."""

    def __init__(self) -> None:
        self._timeout = dt.timedelta(minutes=30)


class _ProcessGroupHCCL:
    """Stands in for torch_npu's compiled class only, with the binding's argument types checked: `(Store, int,
    int, Options)` or `(Store, int, int, timedelta)`."""

    Options = _Options
    made: list[tuple] = []

    def __init__(self, store, rank, size, options) -> None:
        if not (isinstance(store, dist.Store) and isinstance(rank, int) and isinstance(size, int)
                and isinstance(options, (_Options, dt.timedelta))):
            raise TypeError("incompatible constructor arguments")
        self.made.append((store, rank, size, options))


@pytest.fixture
def torch_npu_stand_in(monkeypatch):
    c10d = types.ModuleType("torch_npu._C._distributed_c10d")
    c10d.ProcessGroupHCCL = _ProcessGroupHCCL  # type: ignore[attr-defined]
    c = types.ModuleType("torch_npu._C")
    c._distributed_c10d = c10d  # type: ignore[attr-defined]
    npu = types.ModuleType("torch_npu")
    npu._C = c  # type: ignore[attr-defined]
    for name, mod in (("torch_npu", npu), ("torch_npu._C", c), ("torch_npu._C._distributed_c10d", c10d)):
        monkeypatch.setitem(sys.modules, name, mod)
    _ProcessGroupHCCL.made.clear()
    return _ProcessGroupHCCL


def test_the_hccl_group_is_built_with_its_store_rank_world_and_timeout(torch_npu_stand_in):
    store = dist.HashStore()
    group = BroadcastGroup(store, 3, 17, backend="hccl", timeout_s=42.0, gen=2, device=torch.device("cpu"))
    ((got_store, rank, size, options),) = torch_npu_stand_in.made
    assert isinstance(group.pg, torch_npu_stand_in)
    assert isinstance(got_store, dist.PrefixStore) and (rank, size) == (3, 17)
    assert options._timeout == dt.timedelta(seconds=42.0)
    got_store.set("k", "v")  # the group's keys live under its generation's prefix of the shared store
    assert store.get("asyncrl-weights-2/k") == b"v"


def test_hccl_without_torch_npu_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # not installed: the import fails
    with pytest.raises(ValueError, match="needs torch_npu"):
        BroadcastGroup(dist.HashStore(), 0, 2, backend="hccl", device=torch.device("cpu"))


def test_validate_refuses_a_transport_the_device_does_not_have():
    an = analyze_run_config(SEED_002, ['rollout.weight_sync="shared_memory"'])
    (problem,) = [p for p in an.problems if p.code == "weight-sync-transport"]
    assert problem.severity == "error" and "needs device cpu" in problem.message and "\n" not in problem.message
    assert an.exit_code != 0


def test_a_device_without_the_transport_is_refused_by_the_table(monkeypatch):
    an = analyze_run_config(SEED_002)
    monkeypatch.setitem(WEIGHT_SYNC_TRANSPORTS, "npu", ("object_store",))
    with pytest.raises(ValueError, match="no transport on 'npu'"):
        weight_sync_transport(an.config, "npu")
