"""Tool calls parsed out of a model's text.

Hermes format (verl's `format: hermes`, Qwen2.5/Qwen3 chat templates):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*34"}}
    </tool_call>

A turn may hold several calls. A call whose JSON does not parse, or that has no string `name`, or whose
`arguments` is not an object, is returned as a `ToolCallError` — the model gets an error message for it (it
is the model's mistake, to be learnt from), the loop never raises. Other formats register in `PARSERS`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A call the model tried to make and got wrong; `message` is what the model is told."""

    raw: str
    message: str


ParsedCall = ToolCall | ToolCallError


def parse_hermes(text: str) -> list[ParsedCall]:
    """Every `<tool_call>…</tool_call>` block of `text`, in order (an unclosed block is no call)."""
    calls: list[ParsedCall] = []
    for m in _HERMES.finditer(text):
        raw = m.group(1)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            calls.append(ToolCallError(raw, f"tool call is not valid JSON: {e.msg} at position {e.pos}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            calls.append(ToolCallError(raw, 'tool call needs {"name": "<tool>", "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models emit the arguments JSON-encoded once more
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCallError(raw, f"arguments of {obj['name']!r} must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls


_BARE = re.compile(r"\s*([A-Za-z_]+)")


def parse_bare(text: str) -> list[ParsedCall]:
    """A turn that begins with a word NAME of letters (`lookup`) calls tool NAME without arguments — for tiny
    models whose vocabulary has no JSON; the tool's inputs come from the row's `tools_kwargs`. A turn that begins
    otherwise (digits) is an answer. The name ends at the first non-letter: a tiny vocabulary without a space
    token decodes `lookup` followed by `1` as "lookup1" (transformers ≥ 5.19 joins such tokens without spaces)."""
    m = _BARE.match(text)
    return [ToolCall(m.group(1), {})] if m else []


PARSERS: dict[str, Callable[[str], list[ParsedCall]]] = {"hermes": parse_hermes, "bare": parse_bare}
"""Tool-call formats by name (verl's `multi_turn.format`)."""


def parser(name: str) -> Callable[[str], list[ParsedCall]]:
    """The parser of format `name`; a clear error names the known ones."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known: {', '.join(sorted(PARSERS))}") from None
