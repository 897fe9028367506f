"""What machine this is, for the `"auto"` measurement's cache key (`engine.plan.auto`) and for every benchmark
result (`benchmarks.common.machine_info`): the CPU model, the ISA flags that decide bf16's speed, the cores.

    amx_bf16 / amx_tile   Intel AMX: bf16 matmuls on tiles (Sapphire Rapids and later), bf16 ≫ fp32
    avx512_bf16           bf16 dot products in AVX-512 (Cooper Lake, Zen 4+); bf16 vs fp32 depends on the kernel
    avx512f / avx2        the fp32 vector width

Read from /proc/cpuinfo (Linux); elsewhere the model is `platform.processor()` and the flags are empty.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
"""The /proc/cpuinfo flags recorded (the ones bf16 vs fp32 speed turns on)."""


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model and the `ISA_FLAGS` present, from the text of /proc/cpuinfo (its first processor)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return {"cpu": model, "isa": [f for f in ISA_FLAGS if f in flags]}


def cpu_identity() -> dict[str, Any]:
    """`{"cpu": model, "isa": [flags], "cores": n}` of this machine."""
    try:
        info = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        info = {"cpu": "", "isa": []}
    if not info["cpu"]:
        info["cpu"] = platform.processor() or platform.machine()
    return {**info, "cores": os.cpu_count() or 1}
