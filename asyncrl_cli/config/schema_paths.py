"""Dotted key paths of the run-config schema: every key (for "did you mean"), the table model at a path, and
the fields a running controller may change — the knob table's `config_path`s, with the bounds and description
of their schema fields (the JSON Schema marks exactly these `x-runtime-mutable`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from engine.config.schema import RunConfig

RUNTIME_MUTABLE = "x-runtime-mutable"
"""JSON Schema marker of the fields a running controller may change (`jsonschema.run_schema` sets it on the
fields `runtime_knobs()` lists, which come from the knob table)."""


@dataclass(frozen=True)
class Knob:
    """A runtime-mutable field: dotted path, type name, bounds and description."""

    path: str
    type: str
    ge: float | None
    gt: float | None
    le: float | None
    lt: float | None
    description: str


def runtime_mutable_paths() -> list[tuple[str, ...]]:
    """Config paths of the knobs a running controller may change: the knob table's `config_path`s."""
    from engine.control.knobs import KNOB_SPECS  # pure Python: the table `ctl set` and the TUI use

    return [spec.config_path for spec in KNOB_SPECS.values() if spec.config_path]


def runtime_knobs() -> dict[str, Knob]:
    """The fields of the runtime knobs, by dotted path, with their schema bounds and description."""
    out: dict[str, Knob] = {}
    for path in runtime_mutable_paths():
        model = submodel_at(path[:-1])
        info = model.model_fields[path[-1]] if model else None
        if info is None:
            raise LookupError(f"knob config_path {'.'.join(path)} is not a field of the run config")
        bounds: dict[str, float | None] = {"ge": None, "gt": None, "le": None, "lt": None}
        for m in info.metadata:
            for b in bounds:
                if hasattr(m, b):
                    bounds[b] = getattr(m, b)
        tname = getattr(info.annotation, "__name__", str(info.annotation))
        dotted = ".".join(path)
        out[dotted] = Knob(
            dotted, tname, bounds["ge"], bounds["gt"], bounds["le"], bounds["lt"], info.description or ""
        )
    return out


def field_paths(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key path of the schema (tables and leaves), for "did you mean" suggestions."""
    paths: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            paths.extend(field_paths(ann, path + "."))
    return paths


def submodel_at(path: tuple[str, ...]) -> type[BaseModel] | None:
    """The model class of the table at `path` (() = RunConfig), or None when `path` is not a table."""
    model: type[BaseModel] = RunConfig
    for part in path:
        info = model.model_fields.get(part)
        ann = info.annotation if info else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model
