"""Checkpoint directories: atomic publish, manifest checksums, corrupt/partial detection, keep-last pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.persist.checkpoint import (
    CheckpointError,
    latest_valid,
    ledger_position,
    list_checkpoints,
    read_checkpoint,
    set_aside_newer,
    step_of,
    verify_checkpoint,
    write_checkpoint,
)


def _save(root: Path, step: int, keep: int = 5, fail: bool = False) -> Path:
    def save_trainer(path: Path) -> None:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"w" * 4096 + bytes([step]))
        if fail:
            raise OSError("disk full")

    return write_checkpoint(root, step, save_trainer=save_trainer, state={"step": step, "version": step},
                            queued=[{"uid": f"0:{step}"}], in_flight=[{"uid": "0:99"}], keep_last=keep)


def test_a_checkpoint_is_complete_and_verifies(tmp_path: Path) -> None:
    path = _save(tmp_path, 3)
    assert path == tmp_path / "global_step_3" and step_of(path) == 3
    assert verify_checkpoint(path) is None
    files = json.loads((path / "manifest.json").read_text())["files"]
    assert set(files) == {"state.json", "queued.json", "in_flight.json", "trainer/model.safetensors"}
    ckpt = read_checkpoint(path)
    assert ckpt["state"]["step"] == 3 and ckpt["queued"] == [{"uid": "0:3"}] and ckpt["in_flight"] == [{"uid": "0:99"}]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_truncated_checkpoint_is_skipped_for_the_previous_one(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    weights = newest / "trainer" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    problem = verify_checkpoint(newest)
    assert problem is not None and "truncated" in problem and "trainer/model.safetensors" in problem
    skipped: list[tuple[Path, str]] = []
    assert latest_valid(tmp_path, lambda p, why: skipped.append((p, why))) == tmp_path / "global_step_2"
    assert skipped == [(newest, problem)]
    with pytest.raises(CheckpointError, match="corrupt"):
        read_checkpoint(newest)


def test_an_edited_file_fails_its_checksum(tmp_path: Path) -> None:
    path = _save(tmp_path, 1)
    (path / "queued.json").write_text('[{"uid":"0:7"}]')  # same size, other content
    assert "sha256" in verify_checkpoint(path)


def test_missing_manifest_or_file_means_unusable(tmp_path: Path) -> None:
    a, b = _save(tmp_path, 1), _save(tmp_path, 2)
    (a / "manifest.json").unlink()
    assert "did not finish" in verify_checkpoint(a)
    (b / "in_flight.json").unlink()
    assert "in_flight.json is missing" in verify_checkpoint(b)
    assert latest_valid(tmp_path) is None


def test_an_interrupted_save_leaves_the_previous_checkpoint_as_the_newest(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    with pytest.raises(OSError, match="disk full"):
        _save(tmp_path, 4, fail=True)
    assert list_checkpoints(tmp_path) == [tmp_path / "global_step_2"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    crashed = tmp_path / ".tmp-global_step_6-12345"  # what a killed process leaves behind
    crashed.mkdir()
    assert list_checkpoints(tmp_path) == [tmp_path / "global_step_2"]
    _save(tmp_path, 8)
    assert not crashed.exists()


def test_keep_last_prunes_the_oldest_and_a_resave_replaces(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, keep=2)
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [4, 5]
    _save(tmp_path, 5, keep=2)
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [4, 5]
    assert verify_checkpoint(tmp_path / "global_step_5") is None


def test_ledger_position_and_setting_aside_newer_checkpoints(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    assert ledger_position(ledger)["ledger_bytes"] == 0
    ledger.write_text('{"uid": "0:1"}\n')
    pos = ledger_position(ledger)
    assert pos["ledger_bytes"] == ledger.stat().st_size and len(pos["ledger_sha256"]) == 64
    root = tmp_path / "ck"
    for step in (2, 4, 6):
        _save(root, step)
    assert set_aside_newer(root, 2) == ["global_step_4", "global_step_6"]
    assert list_checkpoints(root) == [root / "global_step_2"]


def test_a_save_that_runs_out_of_space_removes_its_partial_directory_and_keeps_the_previous(tmp_path: Path) -> None:
    """The save layer's own classification (no root needed; `tests/runtime/test_trainer_shell.py` fills a real tmpfs):
    ENOSPC anywhere in the error's chain — torch's writer wraps it in a RuntimeError — is `NoSpaceForCheckpoint`."""
    import errno

    from engine.persist.checkpoint import NoSpaceForCheckpoint

    kept = _save(tmp_path, 2)

    def save_trainer(path: Path) -> None:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"w" * 4096)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from e

    with pytest.raises(NoSpaceForCheckpoint, match="no space left for global_step_4 .*partial directory was removed"):
        write_checkpoint(tmp_path, 4, save_trainer=save_trainer, state={"step": 4}, queued=[], in_flight=[],
                         keep_last=1)
    assert list_checkpoints(tmp_path) == [kept] and verify_checkpoint(kept) is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(OSError, match="disk full") as other:  # any other failure is not called a full disk
        _save(tmp_path, 5, fail=True)
    assert not isinstance(other.value, NoSpaceForCheckpoint)


def test_the_ledger_is_fsynced_where_a_checkpoint_records_its_position(tmp_path: Path, monkeypatch) -> None:
    import os

    from engine.persist.ledger import Ledger

    ledger = Ledger(tmp_path)
    ledger.record(["0:1", "0:2"], "trained", step=1, version=1)
    synced: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    pos = ledger_position(ledger.path)
    assert pos["ledger_bytes"] == ledger.path.stat().st_size > 0
    assert ledger.path.stat().st_ino in synced  # the bytes the checkpoint counts are on disk before it is published
