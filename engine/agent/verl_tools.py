"""A verl tool YAML entry whose `class_name` is the user's own class, as a stateful `Tool` — checked, never imported.

verl loads `class_name: pkg.module.Class` with `importlib` from its `sys.path`. Here nothing of the user's is
imported outside a box: the module path becomes a file (`pkg/module.py`) searched in the given directories (the
YAML's, the run file's, the working directory) and then `sys.path`; the file is parsed (not run) to check that
it defines `Class` at top level. Only that one file is bound into the box, so it must import what it needs by
absolute name: the standard library, numpy / sympy, and `verl.tools.base_tool` / `verl.tools.schemas` /
`verl.utils.rollout_trace`, which the box's shim (`engine/agent/box_lib/verl`, verl 0.6 / 0.7's interface)
provides — a relative import (`from .base_tool import ...`) or a sibling module is not there.

The entry's `config` is what the class is built with; asyncrl reads three keys of it (the class sees them too):
`default_timeout` (per-call wall clock, 30 s, as verl's sandbox tool), `memory_limit_mb` (1024) and
`trajectory_timeout_s` (the box's whole life, 600 s).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

from engine.agent.sandbox import SandboxLimits
from engine.agent.tools import RESERVED_MODULES, Tool


def find_module_file(module: str, dirs: list[Path | None]) -> Path | None:
    """`pkg.module` as `pkg/module.py` in the first of `dirs` (then `sys.path`) that has it."""
    rel = Path(*module.split(".")).with_suffix(".py")
    for d in [*dirs, *(Path(p) for p in sys.path if p)]:
        if d is not None and (Path(d) / rel).is_file():
            return (Path(d) / rel).resolve()
    return None


def verl_class_tool(entry: dict[str, Any], dirs: list[Path | None]) -> Tool:
    """The `Tool` of one YAML entry naming a user class, or a ValueError saying what is wrong."""
    cls_path = str(entry.get("class_name", ""))
    module, _, cls = cls_path.rpartition(".")
    if not module or not all(p.isidentifier() for p in cls_path.split(".")):
        raise ValueError("class_name must be a dotted path `package.module.Class`")
    file = find_module_file(module, dirs)
    if file is None:
        if module == "verl" or module.startswith("verl."):
            raise ValueError("no asyncrl equivalent (a class of verl's own; name a tool file of yours by its "
                             "module path instead)")
        searched = ", ".join(str(d) for d in dirs if d is not None)
        raise ValueError(f"no file {Path(*module.split('.')).with_suffix('.py')} (searched {searched} and "
                         "sys.path)")
    if file.stem in sys.stdlib_module_names or file.stem in RESERVED_MODULES:
        raise ValueError(f"rename {file.name}: a tool's module may not be named as a standard-library module, "
                         f"{', '.join(RESERVED_MODULES)}")
    try:
        tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"), str(file))
    except SyntaxError as e:
        raise ValueError(f"{file}: syntax error at line {e.lineno}: {e.msg}") from None
    if not any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body):
        raise ValueError(f"{file} defines no class {cls} at top level")
    schema = entry.get("tool_schema") or {}
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not fn.get("name"):
        raise ValueError("tool_schema.function.name is missing (verl's OpenAI function schema)")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ValueError("tool_schema.function.parameters must be a JSON schema of type object")
    cfg = entry.get("config") or {}
    if not isinstance(cfg, dict):
        raise ValueError("config must be a mapping")
    try:
        limits = SandboxLimits(timeout_s=float(cfg.get("default_timeout", 30)),
                               memory_mb=int(cfg.get("memory_limit_mb", 1024)))
        life = float(cfg.get("trajectory_timeout_s", 600))
    except (TypeError, ValueError) as e:
        raise ValueError(f"config: {e}") from None
    if limits.timeout_s <= 0 or life <= 0:
        raise ValueError("config: default_timeout and trajectory_timeout_s must be positive")
    return Tool(str(fn["name"]), str(fn.get("description", "")), {"type": "object", **params}, f"{file}:{cls}",
                limits, config=dict(cfg), trajectory_timeout_s=life)
