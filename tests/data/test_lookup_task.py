"""The built-in multi-turn `lookup` task: the secret is only in the row's tool kwargs, and only the model's
last turn after the tool's answer scores."""

from __future__ import annotations

from engine.data.builtin import builtin_rows, corpus_texts
from engine.data.rewards import LOOKUP_CALL_BONUS, get_reward_fn
from engine.models.tiny import build_tiny_tokenizer


def test_rows_hide_the_secret_in_the_tool_kwargs():
    rows = builtin_rows("lookup", "train", size=5)
    for r in rows:
        secret = r["reward_model"]["ground_truth"]
        assert r["prompt"] == [{"role": "user", "content": "secret="}]
        assert r["extra_info"]["tools_kwargs"] == {"lookup": {"create_kwargs": {"secret": secret}}}
    assert {r["reward_model"]["ground_truth"] for r in builtin_rows("lookup", "val")}.isdisjoint(
        r["reward_model"]["ground_truth"] for r in builtin_rows("lookup", "train"))


def test_reward_scores_the_last_turn_never_the_tools_answer():
    fn = get_reward_fn("auto", "asyncrl/lookup")
    called = "lookup\n<tool_response>\n381\n</tool_response>\n"
    assert fn(called + "381", "381")["score"] == 1.0
    assert fn(called + "999", "381")["score"] == LOOKUP_CALL_BONUS + (1 - LOOKUP_CALL_BONUS) * 0.5  # stop only
    assert fn("381", "381")["score"] == 1 - LOOKUP_CALL_BONUS  # right by luck, without the tool
    assert fn(called, "381")["score"] < 0.5  # the tool's answer alone is no answer


def test_the_tools_tokenizer_writes_calls_and_answers_without_unknown_tokens():
    tok = build_tiny_tokenizer(tasks=("copy", "lookup"))
    assert "lookup" in corpus_texts(("lookup",))
    for text in ("lookup", "\n<tool_response>\n381\n</tool_response>\n", "secret="):
        assert tok.unk_token_id not in tok.encode(text, add_special_tokens=False)
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
