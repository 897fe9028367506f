"""The tool registry: Python functions with an OpenAI-style JSON schema, and verl's tool config.

A `Tool` names a function (`module:function`, run in the sandbox) and carries the schema the model is shown
(`{"type": "function", "function": {"name", "description", "parameters"}}`, what chat templates take as
`tools=`). `ToolRegistry.check` validates a call's arguments against the schema (required keys, no unknown
keys, JSON types of the top-level properties) before anything runs: a malformed call is the model's mistake
and comes back to it as an error text.

`from_verl_yaml` reads verl's `actor_rollout_ref.rollout.multi_turn.tool_config_path` file
(`tools: [{class_name, config, tool_schema}]`). A `class_name` of the user's own (a file found without importing
it: `engine.agent.verl_tools`) runs as a stateful tool — its instance per trajectory in a box of its own
(`engine.agent.session`); verl's own classes are mapped where asyncrl has an equivalent and refused by name
otherwise — a tool silently missing would change the experiment. The sandbox-fusion code interpreter runs where verl's config says: on the SandboxFusion service
when it names a `sandbox_fusion_url` (`engine.agent.fusion`; `num_workers` calls at once), else as the built-in
`python` tool in the local box — with the config's timeout and memory limit either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.agent.fusion import FusionService
from engine.agent.sandbox import SandboxLimits
from engine.agent.tool_calls import ToolCall

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,),
    "array": (list,), "null": (type(None),),
}


@dataclass(frozen=True)
class Tool:
    """One tool: its schema for the model and the function that runs it."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: str
    """`module:function`, imported and called in the sandbox with the call's arguments."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    service: FusionService | None = None
    """A SandboxFusion service that runs the call's `code` instead of the local box (verl's retool)."""
    config: dict[str, Any] | None = None
    """A stateful verl-style tool (`function` = `file.py:Class`): the YAML's `config` its class is built with;
    None for a plain function. Its instances live per trajectory (`engine.agent.session`)."""
    trajectory_timeout_s: float = 600.0
    """A stateful tool's box is killed this long after it started, released or not."""

    @property
    def stateful(self) -> bool:
        return self.config is not None

    def openai_schema(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


CALCULATOR = Tool(
    "calculator", "Evaluate an arithmetic expression exactly (+, -, *, /, //, %, ** and parentheses).",
    {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 123*456+7"}},
     "required": ["expression"], "additionalProperties": False},
    "engine.agent.builtin_tools:calculator", SandboxLimits(timeout_s=5.0, memory_mb=256),
)
PYTHON = Tool(
    "code_interpreter", "Run Python code and return what it prints.",
    {"type": "object", "properties": {"code": {"type": "string", "description": "The code to execute."}},
     "required": ["code"], "additionalProperties": False},
    "engine.agent.builtin_tools:python", SandboxLimits(timeout_s=10.0, memory_mb=1024),
)
LOOKUP = Tool(
    "lookup", "Look up this problem's secret.", {"type": "object", "properties": {}, "additionalProperties": False},
    "engine.agent.builtin_tools:lookup", SandboxLimits(timeout_s=5.0, memory_mb=256),
)
BUILTIN_TOOLS: dict[str, Tool] = {"calculator": CALCULATOR, "python": PYTHON, "lookup": LOOKUP}
"""Built-in tools by their config name (the model sees `Tool.name`)."""


class ToolRegistry:
    """The tools of a run, by the name the model calls them with."""

    def __init__(self, tools: list[Tool]) -> None:
        names = [t.name for t in tools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dup)}")
        self.tools = {t.name: t for t in tools}

    @staticmethod
    def builtin(names: list[str]) -> ToolRegistry:
        unknown = [n for n in names if n not in BUILTIN_TOOLS]
        if unknown:
            raise ValueError(f"unknown built-in tool(s) {', '.join(unknown)}; known: {', '.join(BUILTIN_TOOLS)}")
        return ToolRegistry([BUILTIN_TOOLS[n] for n in names])

    def needs_box(self) -> bool:
        """Whether any tool runs in the local box (not on a SandboxFusion service)."""
        return any(t.service is None for t in self.tools.values())

    def remote(self) -> list[str]:
        """`name → URL` of every tool that runs on a SandboxFusion service."""
        return [f"{t.name} → SandboxFusion at {t.service.url}" for t in self.tools.values() if t.service]

    def openai_schemas(self) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in self.tools.values()]

    def check(self, call: ToolCall) -> str | None:
        """None when `call` may run, else the error text the model is shown."""
        tool = self.tools.get(call.name)
        if tool is None:
            return f"unknown tool {call.name!r}; available: {', '.join(self.tools)}"
        params = tool.parameters
        props: dict[str, Any] = params.get("properties", {})
        missing = [k for k in params.get("required", []) if k not in call.arguments]
        if missing:
            return f"{call.name}: missing argument(s) {', '.join(missing)}"
        if params.get("additionalProperties") is False:
            extra = [k for k in call.arguments if k not in props]
            if extra:
                return f"{call.name}: unknown argument(s) {', '.join(extra)}"
        for key, value in call.arguments.items():
            want = props.get(key, {}).get("type")
            types = _JSON_TYPES.get(want) if isinstance(want, str) else None
            if types and (not isinstance(value, types) or (want in ("integer", "number") and isinstance(value, bool))):
                return f"{call.name}: argument {key!r} must be of type {want}"
        return None


_VERL_CODE_TOOLS = ("SandboxFusionTool", "CustomSandboxFusionTool")
RESERVED_MODULES = ("runner", "box_session", "verl")
"""Module names a tool file may not have: the box's own (`/box/runner.py`, `/box/lib`)."""


def run_tools(mt: Any, base_dir: Path | None = None) -> ToolRegistry:
    """A run's tools (`[rollout.multi_turn]`): verl's tool config when given, else the named built-ins, and the
    user's own (`tool`); relative paths from `base_dir` (validate: the run file's directory), else from the
    working directory. ValueError names what is wrong."""
    tools: list[Tool] = []
    if mt.tool_config_path:
        path = Path(mt.tool_config_path)
        tools += from_verl_yaml(path if path.is_absolute() or base_dir is None else base_dir / path,
                                base_dir).tools.values()
    elif mt.tools:
        tools += ToolRegistry.builtin(list(mt.tools)).tools.values()
    tools += [user_tool(t, base_dir) for t in getattr(mt, "tool", [])]
    return ToolRegistry(tools)


def user_tool(t: Any, base_dir: Path | None = None) -> Tool:
    """A `[[rollout.multi_turn.tool]]` as a `Tool`: its file must exist (it is not imported here) and be a
    module name the box can import (an identifier that no standard-library module shadows)."""
    import sys

    file, _, fn = str(t.function).rpartition(":")
    path = Path(file)
    if not path.is_absolute():
        here = base_dir / path if base_dir is not None else None
        path = here if here is not None and here.is_file() else Path.cwd() / path
    if not path.is_file():
        raise ValueError(f"tool {t.name}: function file {file} not found")
    if not path.stem.isidentifier() or path.stem in sys.stdlib_module_names or path.stem in RESERVED_MODULES:
        raise ValueError(f"tool {t.name}: rename {path.name}: its name must be a Python identifier that no "
                         "standard-library module uses")
    params = t.parameters
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ValueError(f"tool {t.name}: parameters must be a JSON schema of type object")
    return Tool(t.name, t.description, {"type": "object", **params}, f"{path.resolve()}:{fn}",
                SandboxLimits(timeout_s=float(t.timeout_s), memory_mb=int(t.memory_mb),
                              max_output_chars=int(t.max_output_chars)))


def _kind(value: object) -> str:
    """A YAML value's kind in the words of the file: mapping, list, string, number, ..."""
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return f"a {type(value).__name__}"


def _read_yaml(path: Path) -> Any:
    """The parsed document, or a ValueError naming the file and what is wrong with it (one line)."""
    import yaml

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a tool config file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}: not valid YAML{where}: {e.problem or e.context or 'unreadable'}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid YAML: nested too deeply") from None


def _positive(cfg: dict[Any, Any], key: str, default: float, integer: bool) -> tuple[float, str | None]:
    """`cfg[key]` (or `default`) and None when it is a finite number > 0 (a whole number when `integer`), else
    (default, what is wrong)."""
    value = cfg.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if ok and integer and value != int(value):
        ok = False
    if ok:
        return value, None
    want = "a whole number > 0" if integer else "a number of seconds > 0"
    shown = repr(value) if isinstance(value, int | float | str) else _kind(value)
    return default, f"config.{key} must be {want}, not {shown}"


def _code_tool(entry: dict[Any, Any], cls: str, name: str, schema: dict[Any, Any]) -> Tool:
    """verl's sandbox-fusion code interpreter as asyncrl's built-in `python` tool with the config's limits."""
    cfg = entry.get("config")
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ValueError(f"config must be a mapping, not {_kind(cfg)}")
    params = schema.get("parameters")
    params = PYTHON.parameters if params is None else params
    if not isinstance(params, dict):
        raise ValueError(f"tool_schema.function.parameters must be a mapping, not {_kind(params)}")
    required = params.get("required") or ["code"]
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError("tool_schema.function.parameters.required must be a list of argument names")
    if required[0] != "code":
        raise ValueError(f"its code argument is {required[0]!r}, asyncrl's interpreter takes 'code'")
    description = schema.get("description", PYTHON.description)
    if not isinstance(description, str):
        raise ValueError(f"tool_schema.function.description must be a string, not {_kind(description)}")
    timeout, bad_timeout = _positive(cfg, "default_timeout", 30, integer=False)
    memory, bad_memory = _positive(cfg, "memory_limit_mb", 1024, integer=True)
    wrong = [w for w in (bad_timeout, bad_memory) if w]
    if wrong:
        raise ValueError(", ".join(wrong))
    limits = SandboxLimits(timeout_s=float(timeout), memory_mb=int(memory))
    url = cfg.get("sandbox_fusion_url")
    service = FusionService(str(url), max_concurrent=int(cfg.get("num_workers", 10)),
                            language=str(cfg.get("default_language", "python"))) if url else None
    return Tool(name, description, params, PYTHON.function, limits, service)


def from_verl_yaml(path: str | Path, base_dir: Path | None = None) -> ToolRegistry:
    """The tools of a verl `tool_config_path` YAML (`tools: [{class_name, config, tool_schema}]`), or a
    ValueError of one line that names the file and every tool asyncrl cannot run or whose entry is malformed.
    A `class_name` of the user's (`pkg.module.Class`) is looked up as a file (`pkg/module.py`) beside the YAML,
    in `base_dir`, the working directory and `sys.path` — never imported here (`engine.agent.verl_tools`).

    Checked: the file exists and is UTF-8 YAML whose top level is a mapping with a `tools:` list of mappings;
    each tool has a `class_name`; a code interpreter's `default_timeout` (seconds) and `memory_limit_mb` are
    finite numbers > 0 (a zero or negative limit would make every call fail)."""
    from engine.agent.verl_tools import verl_class_tool

    path = Path(path)
    doc = _read_yaml(path)
    if doc is None:
        raise ValueError(f"{path}: empty: no tools under `tools:`")
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: the top level must be a mapping with a `tools:` list, not {_kind(doc)}")
    entries = doc.get("tools")
    if not isinstance(entries, list):
        raise ValueError(f"{path}: `tools:` must be a list of tools, not {_kind(entries)}")
    tools: list[Tool] = []
    refused: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            refused.append(f"tools[{i}]: must be a mapping with class_name, config and tool_schema, not "
                           f"{_kind(entry)}")
            continue
        cls = entry.get("class_name")
        schema = entry.get("tool_schema") or {}
        schema = schema.get("function") or {} if isinstance(schema, dict) else schema
        if not isinstance(cls, str) or not cls:
            refused.append(f"tools[{i}]: class_name must be a class name, not {_kind(cls)}")
            continue
        if not isinstance(schema, dict):
            refused.append(f"tools[{i}] ({cls}): tool_schema.function must be a mapping, not {_kind(schema)}")
            continue
        name = schema.get("name", cls)
        if not isinstance(name, str) or not name:
            refused.append(f"tools[{i}] ({cls}): tool_schema.function.name must be a string, not {_kind(name)}")
            continue
        try:
            if cls.rsplit(".", 1)[-1] in _VERL_CODE_TOOLS:
                tools.append(_code_tool(entry, cls, name, schema))
            else:
                tools.append(verl_class_tool(entry, [path.parent, base_dir, Path.cwd()]))
        except ValueError as e:
            refused.append(f"{name} ({cls}): {e}")
    if refused:
        raise ValueError(f"{path}: cannot use these verl tools: " + "; ".join(refused))
    if not tools:
        raise ValueError(f"{path}: no tools under `tools:`")
    return ToolRegistry(tools)
