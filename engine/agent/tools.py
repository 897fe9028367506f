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


def from_verl_yaml(path: str | Path, base_dir: Path | None = None) -> ToolRegistry:
    """The tools of a verl `tool_config_path` YAML, or a ValueError naming every tool asyncrl cannot run.
    A `class_name` of the user's (`pkg.module.Class`) is looked up as a file (`pkg/module.py`) beside the YAML,
    in `base_dir`, the working directory and `sys.path` — never imported here (`engine.agent.verl_tools`)."""
    import yaml

    from engine.agent.verl_tools import verl_class_tool

    doc = yaml.safe_load(Path(path).read_text()) or {}
    tools: list[Tool] = []
    refused: list[str] = []
    for entry in doc.get("tools", []):
        cls = str(entry.get("class_name", ""))
        schema = (entry.get("tool_schema") or {}).get("function") or {}
        cfg = entry.get("config") or {}
        name = schema.get("name", cls)
        if cls.rsplit(".", 1)[-1] in _VERL_CODE_TOOLS:
            params = schema.get("parameters") or PYTHON.parameters
            code_arg = next(iter(params.get("required") or ["code"]))
            if code_arg != "code":
                refused.append(f"{name} ({cls}): its code argument is {code_arg!r}, asyncrl's interpreter takes 'code'")
                continue
            limits = SandboxLimits(timeout_s=float(cfg.get("default_timeout", 30)),
                                   memory_mb=int(cfg.get("memory_limit_mb", 1024)))
            url = cfg.get("sandbox_fusion_url")
            service = FusionService(str(url), max_concurrent=int(cfg.get("num_workers", 10)),
                                    language=str(cfg.get("default_language", "python"))) if url else None
            tools.append(Tool(name, schema.get("description", PYTHON.description), params, PYTHON.function, limits,
                              service))
        else:
            try:
                tools.append(verl_class_tool(entry, [Path(path).parent, base_dir, Path.cwd()]))
            except ValueError as e:
                refused.append(f"{name} ({cls}): {e}")
    if refused:
        raise ValueError("cannot run these verl tools: " + "; ".join(refused))
    if not tools:
        raise ValueError(f"{path}: no tools under `tools:`")
    return ToolRegistry(tools)
