"""Tool answers as token ids, through the model's chat template, without re-tokenising the conversation.

With a chat template, the answers' user turn is the difference between two renderings of a fixed stand-in
conversation: `[user, assistant]` and `[user, assistant, tool…]` with the generation prompt. Only that
difference is tokenised and appended after the model's own tokens, which end at its end-of-turn token; what
the template writes after the end-of-turn token (Qwen: a newline) is kept at the front of the difference, so
the stream reads exactly as the template renders a conversation. Without a chat template (the tiny built-in
tokenizers), the answers are wrapped as `<tool_response>…</tool_response>` lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_STAND_IN = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


def tool_answer_text(tokenizer: Any, answers: list[str], template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The text of one user turn that carries `answers` (one per tool call), ending with the generation
    prompt of the next assistant turn (`template_kwargs` = `data.apply_chat_template_kwargs`, passed to both
    renderings, as verl's agent loop does)."""
    if getattr(tokenizer, "chat_template", None):
        kw = dict(template_kwargs or {})
        before = tokenizer.apply_chat_template(_STAND_IN, tokenize=False, **kw)
        after = tokenizer.apply_chat_template(
            _STAND_IN + [{"role": "tool", "content": a} for a in answers], tokenize=False,
            add_generation_prompt=True, **kw,
        )
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once a tool answer follows")
        eos = tokenizer.eos_token or ""
        cut = before.rfind(eos) + len(eos) if eos and eos in before else len(before)
        return before[cut:] + after[len(before):]
    return "".join(f"\n<tool_response>\n{a}\n</tool_response>" for a in answers) + "\n"


def tool_answer_ids(tokenizer: Any, answers: list[str], template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """`tool_answer_text` tokenised on its own (no special tokens added)."""
    return list(tokenizer.encode(tool_answer_text(tokenizer, answers, template_kwargs), add_special_tokens=False))
