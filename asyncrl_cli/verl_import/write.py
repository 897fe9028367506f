"""Render a `Conversion` as a commented asyncrl run file (tomlkit)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tomlkit

from asyncrl_cli.config.catalog import RUN_SCHEMA_FILE, presets_dir
from asyncrl_cli.config.schema_paths import field_paths
from asyncrl_cli.verl_import.convert import Conversion

ORDER = (
    "", "model", "data", "data.overlong_buffer", "resources", "resources.trainer", "resources.rollout", "trainer", "trainer.optim",
    "rollout", "rollout.multi_turn", "async_training", "algorithm", "algorithm.filter_groups", "algorithm.rollout_correction",
    "checkpoint", "logging",
)  # fmt: skip


def guess_hardware(conv: Conversion, script_name: str) -> str:
    """Ascend when the script says NPU (`trainer.device=npu`, the name, a variable; 910C for 16 per node), GB200
    when its name, a value or a variable says so (verl's TensorRT-LLM scripts), else H100."""
    per_node = max(int(conv.values.get(f"resources.{r}.gpus_per_node", 8)) for r in ("trainer", "rollout"))
    npu = "npu" in script_name.lower() or any("trainer.device=" in ov and "npu" in ov for ov, _ in conv.ignored) or any(
        "ascend" in v.lower() or "npu" in v.lower()
        for v in (conv.script.variables.values() if conv.script else [])
    )
    if npu:
        return "ascend-910c" if per_node > 8 else "ascend-910b"
    said = [script_name, *map(str, conv.values.values()), *(conv.script.variables.values() if conv.script else [])]
    return "gb200" if any("gb200" in s.lower() for s in said) else "h100"


def render(conv: Conversion, script: Path, out: Path, hardware: str, hardware_note: str | None) -> str:
    """The run-file text, with the verl origin of each key as a comment and the leftovers listed."""
    schema = os.path.relpath(presets_dir() / RUN_SCHEMA_FILE, out.resolve().parent)
    header = [
        f"#:schema {schema}",
        f"# Imported from the verl script {script.name} by `asyncrl import verl`.",
        f"# Check:  asyncrl validate {out}",
        f"# Run:    asyncrl launch {out}",
    ]
    if hardware_note:
        header.append(f"# {hardware_note}")
    if conv.warnings:
        header += ["#", "# WARNING: this run differs from the script's where the import was asked to:"]
        header += [f"#   {w}" for w in conv.warnings]
    header.append("")
    values: dict[str, Any] = dict(conv.values)
    values.setdefault("name", re.sub(r"[^A-Za-z0-9._-]+", "-", script.stem))
    values["resources.hardware"] = hardware
    doc = tomlkit.document()
    tables: dict[str, Any] = {"": doc}
    for section in ORDER[1:]:
        keys = [k for k in values if k.rpartition(".")[0] == section]
        children = [s for s in ORDER if s.startswith(section + ".")]
        if not keys and not any(k.rpartition(".")[0] == c for c in children for k in values):
            continue
        parent, _, leaf = section.rpartition(".")
        tbl = tomlkit.table(is_super_table=not keys)
        tables[parent].add(leaf, tbl)
        tables[section] = tbl
    order = {p: i for i, p in enumerate(field_paths())}
    for key in sorted(values, key=lambda k: (ORDER.index(k.rpartition(".")[0]), order.get(k, 0))):
        section, _, leaf = key.rpartition(".")
        item = tomlkit.item(values[key])
        src = conv.sources.get(key)
        if src:
            item.comment(f"verl: {src}")
        tables[section].add(leaf, item)
    tail: list[str] = []
    if conv.ignored:
        tail += ["", "# verl overrides with no effect on the experiment, or honoured without a key (not written):"]
        tail += [f"#   {ov}  ({why})" for ov, why in conv.ignored]
    if conv.notes:
        tail += ["", "# notes:"] + [f"#   {n}" for n in conv.notes]
    return "\n".join(header) + tomlkit.dumps(doc) + ("\n".join(tail) + "\n" if tail else "")
