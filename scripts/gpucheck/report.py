"""The one JSON report of the GPU check: named sections run under a wall-clock budget, each one's result
or error recorded, the file rewritten after every section so a killed run still leaves what it measured."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.persist.atomic import atomic_write_text

SCHEMA = "asyncrl.gpu_check/1"


def cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib_and_reset() -> float | None:
    """Peak GPU memory allocated since the last call, GiB (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return round(peak, 2)


def free_gpu() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment() -> dict[str, Any]:
    """What ran the check: the device, the framework versions, which optional engines were importable."""
    import importlib.util

    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            {
                "gpu": props.name,
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "compute_capability": f"{props.major}.{props.minor}",
                "cuda": torch.version.cuda,
            }
        )
        try:
            version = torch.cuda.nccl.version()
            env["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as e:  # noqa: BLE001
            env["nccl"] = f"unknown: {e}"
    try:
        import megatron.core

        env["megatron_core"] = megatron.core.__version__
    except Exception as e:  # noqa: BLE001 — recorded, the Megatron section then reports it too
        env["megatron_core"] = f"not importable: {type(e).__name__}: {e}"
    spec = importlib.util.find_spec("vllm")
    env["vllm"] = "installed" if spec is not None and spec.origin else "not installed"
    return env


class Report:
    """Sections in order, each `{"status": "ok" | "error" | "skipped", ...}`, written to `path` as JSON."""

    def __init__(self, path: Path, budget_s: float, settings: dict[str, Any]) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "budget_s": budget_s,
            "settings": settings,
            "sections": {},
        }
        self.write()

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.write()

    def run(self, name: str, fn: Callable[[], dict[str, Any]], need_s: float = 0.0) -> dict[str, Any] | None:
        """Run one section if at least `need_s` seconds of the budget are left; record its outcome."""
        if self.left_s() < need_s:
            self.data["sections"][name] = {
                "status": "skipped",
                "reason": f"time budget: {self.left_s():.0f}s left, needs ~{need_s:.0f}s",
            }
            self.write()
            return None
        start = time.monotonic()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            result = fn()
            entry = {"status": "ok", **result}
        except Exception as e:  # noqa: BLE001 — a failed section must not lose the others' numbers
            result = None
            entry = {
                "status": "error",
                "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": traceback.format_exc(limit=12)[-4000:],
            }
        entry["wall_s"] = round(time.monotonic() - start, 2)
        self.data["sections"][name] = entry
        print(f"[gpu_check] {name}: {entry['status']} in {entry['wall_s']}s", flush=True)
        free_gpu()
        self.write()
        return result

    def finish(self) -> dict[str, Any]:
        self.data["wall_s"] = round(time.monotonic() - self.t0, 1)
        self.write()
        return self.data

    def write(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=2, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)
