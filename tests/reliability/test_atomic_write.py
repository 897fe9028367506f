"""The one atomic writer (`engine.persist.atomic`): a reader sees the old content or the new, never a torn file,
and a failed write leaves the old file and no temporary behind."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from engine.persist import atomic
from engine.persist.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text, publish_dir


def test_write_replaces_the_content_and_leaves_only_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "entry.json"  # parents are created
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2, "b": [1, 2]})
    assert json.loads(path.read_text()) == {"a": 2, "b": [1, 2]}
    assert path.read_text().endswith("\n")
    atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_bytes() == "héllo".encode()
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["entry.json"]


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.jsonl"
    atomic_write_bytes(path, b"old\n")

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(path, b"new\n")
    assert path.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.jsonl"]


def test_concurrent_writers_never_leave_a_torn_file(tmp_path: Path) -> None:
    """Threads writing large payloads to one path: every read sees one writer's payload whole."""
    path = tmp_path / "cache.json"
    payloads = [{"writer": w, "fill": str(w) * 200_000} for w in range(4)]
    atomic_write_json(path, payloads[0])
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.append(json.loads(path.read_text())["writer"])

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=lambda w=w: [atomic_write_json(path, payloads[w]) for _ in range(5)])
               for w in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert seen and set(seen) <= {0, 1, 2, 3}
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]


def test_publish_dir_swaps_a_whole_directory_in(tmp_path: Path) -> None:
    final = tmp_path / "trainer"
    for content in ("first", "second"):
        staging = tmp_path / f".tmp-{content}"
        (staging / "sub").mkdir(parents=True)
        (staging / "sub" / "w.bin").write_text(content)
        atomic.fsync_tree(staging)
        publish_dir(staging, final)
        assert (final / "sub" / "w.bin").read_text() == content
        assert not staging.exists()
    assert sorted(os.listdir(tmp_path)) == ["trainer"]  # the replaced copy is gone
