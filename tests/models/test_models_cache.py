"""Build-once-atomically in the model cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine.models.cache import build_once, default_cache_dir


def test_concurrent_callers_build_once(tmp_path: Path) -> None:
    calls: list[int] = []

    def builder(tmp: Path) -> None:
        calls.append(1)
        time.sleep(0.2)
        (tmp / "weights").write_text("w")

    target = tmp_path / "cache" / "model"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(build_once(target, builder))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [target] * 4
    assert (target / "weights").read_text() == "w"


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def builder(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        build_once(tmp_path / "model", builder)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_cache_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASYNCRL_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("ASYNCRL_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "asyncrl"
