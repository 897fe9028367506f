"""The registry of live runs (pure, no Ray): claiming a name, pruning dead drivers, atomic entries, and
resolving what a user typed (id, name, id prefix) to exactly one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from asyncrl_cli.commands._control import control_exit_code
from engine.control import registry as reg
from engine.control.errors import AmbiguousRunError, RunNotFoundError


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(reg.STATE_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_claim_is_one_atomic_file_with_the_run_identity(state: Path) -> None:
    entry = reg.claim("tiny-cpu", run_dir="/runs/tiny-cpu")
    assert entry.id.startswith("tiny-cpu-") and len(entry.id) == len("tiny-cpu-") + 6
    files = list((state / "runs").iterdir())
    assert [p.name for p in files if not p.name.startswith(".")] == [f"{entry.id}.json"]
    assert not [p for p in files if p.name.endswith(".tmp")]
    doc = json.loads((state / "runs" / f"{entry.id}.json").read_text())
    assert {k: doc[k] for k in ("id", "name", "run_dir", "pid")} == {
        "id": entry.id, "name": "tiny-cpu", "run_dir": "/runs/tiny-cpu", "pid": os.getpid()}
    assert doc["address"] is None and doc["started"] > 0
    reg.update(entry, address="10.0.0.1:6379")
    assert [e.address for e in reg.live_runs()] == ["10.0.0.1:6379"]
    reg.release(entry)
    assert reg.live_runs() == []


def test_a_second_claim_of_a_live_name_is_refused_naming_the_live_run(state: Path) -> None:
    first = reg.claim("tiny-cpu", run_dir="/runs/tiny-cpu")
    with pytest.raises(reg.NameInUse) as err:
        reg.claim("tiny-cpu")
    msg = str(err.value)
    assert first.id in msg and "/runs/tiny-cpu" in msg and "--allow-same-name" in msg and "--name" in msg
    assert control_exit_code(err.value) == 1 and "\n" not in msg
    second = reg.claim("tiny-cpu", allow_same_name=True)
    other = reg.claim("other")
    assert len({first.id, second.id, other.id}) == 3
    assert [e.id for e in reg.live_runs()] == [first.id, second.id, other.id]


def test_racing_claims_of_one_name_let_exactly_one_through(state: Path) -> None:
    won, refused = [], []
    barrier = threading.Barrier(8)

    def claim() -> None:
        barrier.wait()
        try:
            won.append(reg.claim("race"))
        except reg.NameInUse:
            refused.append(1)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7


def test_entries_of_dead_or_recycled_pids_are_pruned_on_read(state: Path) -> None:
    live = reg.claim("alive")
    dead = reg.claim("dead", allow_same_name=True)
    reg.update(dead, pid=_dead_pid())
    recycled = reg.claim("recycled")  # our pid, but a different process start time: not the same process
    reg.update(recycled, pid_start=(recycled.pid_start or 0) + 12345)
    foreign = reg.claim("elsewhere")  # a shared home directory: another host's entry is not ours to prune
    reg.update(foreign, host="another-host", pid=_dead_pid())
    assert [e.id for e in reg.live_runs()] == [live.id]
    left = sorted(p.stem for p in (state / "runs").glob("*.json"))
    assert left == sorted([live.id, foreign.id])
    # the name of a dead run is free again
    assert reg.claim("dead").name == "dead"


def test_a_torn_or_interrupted_write_never_corrupts_the_registry(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = reg.claim("tiny-cpu", run_dir="/a")
    (state / "runs" / "garbage.json").write_text('{"id": "gar')  # torn by a crash of some other writer

    def crash(src: object, dst: object) -> None:
        raise OSError("disk full")

    real_replace = os.replace
    monkeypatch.setattr(reg.os, "replace", crash)
    with pytest.raises(OSError):
        reg.update(entry, run_dir="/b")
    monkeypatch.setattr(reg.os, "replace", real_replace)
    assert [(e.id, e.run_dir) for e in reg.live_runs()] == [(entry.id, "/a")]  # the old entry, whole


def _entries() -> list[reg.RunEntry]:
    return [
        reg.RunEntry(id="tiny-cpu-3fa9c2", name="tiny-cpu", run_dir="/r/tiny-cpu", started=1000.0),
        reg.RunEntry(id="tiny-cpu-81bb0e", name="tiny-cpu", run_dir="/r/tiny-cpu-2", started=2000.0),
        reg.RunEntry(id="big-5d1a77", name="big", run_dir="/r/big", started=3000.0),
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [("tiny-cpu-81bb0e", "tiny-cpu-81bb0e"), ("tiny-cpu-3", "tiny-cpu-3fa9c2"), ("big", "big-5d1a77"),
     ("b", "big-5d1a77")],
)
def test_an_id_a_name_or_a_unique_prefix_names_one_run(query: str, expected: str) -> None:
    assert reg.resolve(query, _entries()).id == expected


def test_an_ambiguous_name_lists_every_candidate_with_dir_and_start() -> None:
    with pytest.raises(AmbiguousRunError) as err:
        reg.resolve("tiny-cpu", _entries())
    msg = str(err.value)
    assert control_exit_code(err.value) == 2
    for rid, run_dir in (("tiny-cpu-3fa9c2", "/r/tiny-cpu"), ("tiny-cpu-81bb0e", "/r/tiny-cpu-2")):
        assert f"{rid} (dir {run_dir}, started " in msg
    assert "big" not in msg and reg.format_time(1000.0) in msg
    with pytest.raises(AmbiguousRunError, match="several runs are live"):
        reg.resolve(None, _entries())
    with pytest.raises(RunNotFoundError, match="no run named 'nope'") as missing:
        reg.resolve("nope", _entries())
    assert control_exit_code(missing.value) == 4 and "tiny-cpu-3fa9c2" in str(missing.value)


def test_run_json_records_this_launch_and_the_earlier_ones(tmp_path: Path) -> None:
    first = reg.RunEntry(id="tiny-cpu-000001", name="tiny-cpu", run_dir=str(tmp_path))
    reg.write_run_file(tmp_path, first)
    second = reg.RunEntry(id="tiny-cpu-000002", name="tiny-cpu", run_dir=str(tmp_path))
    reg.write_run_file(tmp_path, second, resumed_from="ckpt")
    reg.write_run_file(tmp_path, second, resumed_from="ckpt")  # rewritten by the same launch: no new history
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["id"] == second.id and doc["resumed_from"] == "ckpt"
    assert [p["id"] for p in doc["previous"]] == [first.id]
