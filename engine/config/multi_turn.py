"""`[rollout.multi_turn]`: multi-turn, tool-using rollouts (a section of `engine.config.sections`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from engine.config.section import Section


class UserToolConfig(Section):
    """A tool of your own (`[[rollout.multi_turn.tool]]`): a Python function in a file, called with the model's
    JSON arguments (plus the row's `tools_kwargs.NAME.create_kwargs`) in the same bubblewrap box as the built-ins
    — only that one file is bound into the box (numpy and sympy importable), nothing else of yours."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    """The name the model calls it by."""
    description: str = ""
    """What the model is told the tool does."""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    """Its arguments as a JSON schema object (`properties`, `required`, `additionalProperties`)."""
    function: str = Field(pattern=r"^[^:\s]+\.py:[A-Za-z_]\w*$")
    """`path/to/file.py:function` (relative to the working directory the run starts in); the function returns
    the answer as text, or prints it and returns None."""
    timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit of one call (the CPU-time limit is one second more)."""
    memory_mb: int = Field(1024, gt=0)
    """Address-space limit of one call."""
    max_output_chars: int = Field(4096, gt=0)
    """The answer is cut after this many characters."""


class MultiTurnConfig(Section):
    """Multi-turn, tool-using rollouts (`[rollout.multi_turn]`; verl's `actor_rollout_ref.rollout.multi_turn`).

    Each response becomes a conversation: the model generates until it emits tool calls or ends its turn;
    the tools run in a sandbox while other trajectories keep generating; their answers are appended as token
    ids through the chat template (never re-tokenised) and excluded from the loss; the next turn is generated
    under the weights current then. One `data.max_response_length` budget covers model and tool tokens."""

    enable: bool = False
    """Turn multi-turn rollouts on."""
    format: Literal["hermes", "bare"] = "hermes"
    """How tool calls are written: `hermes` = `<tool_call>{"name": …, "arguments": {…}}</tool_call>`;
    `bare` = a turn that is one word, the tool's name (no arguments; for tiny models)."""
    tools: list[str] = []
    """Built-in tools to offer (`calculator`, `python`, `lookup`). A row's `extra_info.tools_kwargs.NAME.
    create_kwargs` (verl's layout) are passed to tool NAME with the model's arguments."""
    tool_config_path: str | None = None
    """verl's tool config YAML (`tools: [{class_name, config, tool_schema}]`); its sandbox-fusion code
    interpreter runs on the SandboxFusion service its `sandbox_fusion_url` names (the `fusion` extra), or as the
    built-in `python` tool in the local box when it names none. A `class_name` of yours (`pkg.module.Class`, the
    file `pkg/module.py` beside the YAML, the run file or the working directory) runs statefully: one box per
    trajectory, `create(**create_kwargs)` at its first call, `execute` per call, `release` when it ends (its
    `config` keys `default_timeout`, `memory_limit_mb`, `trajectory_timeout_s` set the limits); verl's own other
    tool classes are refused."""
    max_assistant_turns: int | None = Field(None, gt=0)
    """End the conversation after this many model turns (None = only the budget ends it)."""
    max_user_turns: int | None = Field(None, gt=0)
    """End the conversation after this many rounds of tool answers (None = no limit)."""
    max_tokens_per_turn: int | None = Field(None, gt=0)
    """A model turn ends after this many tokens even without its end-of-turn token, and is parsed for calls
    like a finished turn (None = a turn ends only at EOS or the response budget)."""
    max_parallel_calls: int = Field(1, gt=0)
    """Tool calls run per model turn; further calls in the turn are answered with an error."""
    max_concurrent_tools: int = Field(4, gt=0)
    """Tool calls running at once on the rollouter's machine (each in its own bubblewrap box)."""
    tool: list[UserToolConfig] = []
    """Your own tools, each a `[[rollout.multi_turn.tool]]` table (beside `tools` or `tool_config_path`)."""
    allow_unsandboxed: bool = False
    """Where no tool sandbox can be built (no bubblewrap, no user namespaces), run tools anyway WITHOUT
    isolation — a plain subprocess with only its rlimits, able to read and write what the run can. For trusted
    tools only; off (the default), tools refuse to start and the run stops with the reason and the fix."""
