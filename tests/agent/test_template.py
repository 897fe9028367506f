"""Tool answers become token ids through the chat template, appended after the model's end-of-turn token."""

from __future__ import annotations

from engine.agent.template import tool_answer_ids, tool_answer_text
from engine.models.tiny import build_tiny_tokenizer

CHATML = (  # ChatML as Qwen's template writes tool answers (newlines inside expressions: HF trims blocks)
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chat_template_answer_follows_the_models_end_of_turn_token():
    tok = build_tiny_tokenizer()
    tok.chat_template = CHATML
    tok.eos_token = "<|im_end|>"
    text = tool_answer_text(tok, ["4", "9"])
    assert text == ("\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n9\n</tool_response>"
                    "<|im_end|>\n<|im_start|>assistant\n")


def test_without_a_template_answers_are_wrapped_and_round_trip():
    tok = build_tiny_tokenizer(tasks=("copy", "reverse", "arith"))
    text = tool_answer_text(tok, ["42"])
    assert text == "\n<tool_response>\n42\n</tool_response>\n"
    ids = tool_answer_ids(tok, ["42"])
    assert "42" in tok.decode(ids)


def test_chat_template_kwargs_reach_the_tool_answer_turn():
    """`data.apply_chat_template_kwargs` also renders the tool answers (as verl's agent loop does)."""
    tok = build_tiny_tokenizer()
    tok.chat_template = CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n' + (x or '')")
    tok.eos_token = "<|im_end|>"
    assert tool_answer_text(tok, ["4"]).endswith("<|im_start|>assistant\n")
    assert tool_answer_text(tok, ["4"], {"x": "<think>"}).endswith("<|im_start|>assistant\n<think>")
