"""JSON Schema export for editors (Taplo/Tombi read the `#:schema` header of each preset).

The schema is flattened (every `$ref` inlined: editor language servers handle `$defs` imperfectly) and
has no `required` lists, because every TOML file is a layer that may set only part of a run; the loader
checks required keys on the merged result. `x-runtime-mutable: true` marks exactly the fields of the runtime
knobs (`schema_paths.runtime_mutable_paths()`, from the knob table), so editors never promise a live change the
controller would refuse.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from engine.plan.hardware import HardwarePreset
from asyncrl_cli.config.schema_paths import RUNTIME_MUTABLE, runtime_mutable_paths
from engine.config.schema import SCHEMA_VERSION, RunConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            target = _inline(defs[name], defs)
            rest = {k: _inline(v, defs) for k, v in node.items() if k != "$ref"}
            return {**target, **rest}
        return {k: _inline(v, defs) for k, v in node.items() if k not in ("$defs", "required")}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def flattened_schema(model: type[BaseModel], schema_id: str) -> dict[str, Any]:
    """The model's JSON Schema with references inlined and `required` dropped."""
    raw = model.model_json_schema(mode="validation")
    flat = _inline(raw, raw.get("$defs", {}))
    return {"$schema": DIALECT, "$id": schema_id, **flat}


def run_schema() -> dict[str, Any]:
    """Schema of run-config files (runs, models, datasets presets and user files)."""
    s = flattened_schema(RunConfig, "urn:asyncrl:schema:run")
    for path in runtime_mutable_paths():
        node = s
        for part in path:
            node = node["properties"][part]
        node[RUNTIME_MUTABLE] = True
    s["x-schema-version"] = SCHEMA_VERSION
    return s


def hardware_schema() -> dict[str, Any]:
    """Schema of `presets/hardware/*.toml`."""
    return flattened_schema(HardwarePreset, "urn:asyncrl:schema:hardware")


def dumps(schema: dict[str, Any]) -> str:
    """Stable text form (what is committed under presets/)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
