"""From `data.*` config to the tokenised prompt stream."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data.parquet import DataError
from engine.data.prompts import load_prompts
from engine.models.tiny import build_tiny_tokenizer

TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<system>default helper\n{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def tok():  # the default tiny tokenizer (copy/reverse), no chat template
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def chat_tok():  # a tokenizer covering all tasks, with a template that injects a default system message
    t = build_tiny_tokenizer(("copy", "reverse", "arith"))
    t.chat_template = TEMPLATE
    return t


def cfg(**kw) -> dict:
    base = {"train_files": ["builtin:copy"], "val_files": [], "max_prompt_length": 64, "reward": "auto",
            "prompt_key": "prompt", "filter_overlong_prompts": True, "shuffle": True, "seed": 0,
            "train_size": 50, "val_size": None, "val_max_samples": None}
    return {**base, **kw}


def _parquet(path: Path, contents: list[str], source: str = "asyncrl/copy") -> str:
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": c}],
             "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"i": i}}
            for i, c in enumerate(contents)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_builtin_copy_prompts(tok) -> None:
    prompts, counters = load_prompts(cfg(shuffle=False), tok, split="train", epoch=3)
    assert counters == {"rows": 50, "kept": 50, "filtered_empty": 0, "filtered_overlong": 0,
                        "cut_val_max_samples": 0, "with_unk": 0}
    p = prompts[7]
    assert (p.uid, p.index, p.epoch) == ("3:7", 7, 3)
    assert tok.decode(p.prompt_ids) == f"copy {p.ground_truth}="
    assert p.data_source == "asyncrl/copy" and p.extra_info == {"split": "train", "index": 7}


def test_shuffle_is_per_epoch_and_deterministic(tok) -> None:
    e0, _ = load_prompts(cfg(), tok, epoch=0)
    e0_again, _ = load_prompts(SimpleNamespace(**cfg()), tok, epoch=0)
    e1, _ = load_prompts(cfg(), tok, epoch=1)
    assert [p.index for p in e0] == [p.index for p in e0_again]
    assert [p.index for p in e0] != [p.index for p in e1]
    assert sorted(p.index for p in e1) == list(range(50))
    assert len({p.uid for p in e0 + e1}) == 100


def test_overlong_and_empty_prompts_are_filtered_and_counted(tok, tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", ["copy 1=", "copy 123456789=", "", "copy 22="])
    prompts, counters = load_prompts(cfg(train_files=[path], max_prompt_length=6, shuffle=False), tok)
    assert [p.index for p in prompts] == [0, 3]
    assert (counters["filtered_overlong"], counters["filtered_empty"], counters["kept"]) == (1, 1, 2)


def test_overlong_raises_when_filtering_is_off(tok, tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", ["copy 1=", "copy 123456789="])
    with pytest.raises(DataError, match=r"d\.parquet#1: prompt has 12 tokens > data.max_prompt_length = 6"):
        load_prompts(cfg(train_files=[path], max_prompt_length=6, filter_overlong_prompts=False), tok)


def test_val_split_keeps_order_and_is_capped(tok) -> None:
    prompts, counters = load_prompts(cfg(val_files=["builtin:reverse"], val_max_samples=10), tok, split="val")
    assert [p.index for p in prompts] == list(range(10))
    assert counters["cut_val_max_samples"] == 54 and counters["kept"] == 10
    assert all(p.extra_info["split"] == "val" for p in prompts)
    assert load_prompts(cfg(), tok, split="val")[0] == []


def test_parquet_and_builtin_mix_get_consecutive_indices(tok, tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", ["copy 1=", "copy 2="])
    prompts, _ = load_prompts(cfg(train_files=[path, "builtin:copy"], train_size=3, shuffle=False), tok)
    assert [p.index for p in prompts] == [0, 1, 2, 3, 4]
    assert [p.ground_truth for p in prompts][:2] == ["1", "1"]


def test_chat_template_keeps_our_system_message(chat_tok) -> None:
    arith = cfg(train_files=["builtin:arith"], max_prompt_length=512, train_size=3)
    prompts, _ = load_prompts(arith, chat_tok)
    text = chat_tok.decode(prompts[0].prompt_ids)
    assert text.startswith("<system>Solve the math problem.") and "default helper" not in text
    assert text.endswith("<assistant>")
    copy_prompts, _ = load_prompts(cfg(train_size=1), chat_tok)  # no system message of its own
    assert chat_tok.decode(copy_prompts[0].prompt_ids).startswith("<system>default helper")


def test_tokenizer_that_cannot_encode_the_task_is_counted(tok) -> None:
    _, counters = load_prompts(cfg(train_files=["builtin:arith"], max_prompt_length=512, train_size=5), tok)
    assert counters["with_unk"] == 5


def test_unresolvable_reward_fails_at_load(tok, tmp_path: Path) -> None:
    path = _parquet(tmp_path / "c.parquet", ["copy 1="], source="someone/chess")
    with pytest.raises(DataError, match="someone/chess"):
        load_prompts(cfg(train_files=[path]), tok)
    prompts, _ = load_prompts(cfg(train_files=[path], reward="copy"), tok)
    assert len(prompts) == 1


def test_chat_template_kwargs_reach_the_template(chat_tok) -> None:
    """`data.apply_chat_template_kwargs` (verl's key) goes to the chat template: a template that reads
    `thinking` renders the training and validation prompts differently with it."""
    from engine.data.prompts import render_prompt

    chat_tok.chat_template = TEMPLATE.replace("<assistant>{% endif %}",
                                              "<assistant>{% if thinking %}copy 1={% endif %}{% endif %}")
    try:
        msgs = [{"role": "user", "content": "copy 12="}]
        assert render_prompt(msgs, chat_tok)[0].endswith("<assistant>")
        assert render_prompt(msgs, chat_tok, template_kwargs={"thinking": True})[0].endswith("<assistant>copy 1=")
        for split in ("train", "val"):
            kw = {"train_size": 2, "val_size": 2, "val_files": ["builtin:copy"], "shuffle": False}
            plain, _ = load_prompts(cfg(**kw), chat_tok, split=split)
            think, _ = load_prompts(cfg(**kw, apply_chat_template_kwargs={"thinking": True}), chat_tok, split=split)
            assert [chat_tok.decode(p.prompt_ids) + "copy 1=" for p in plain] == [
                chat_tok.decode(p.prompt_ids) for p in think]
    finally:
        chat_tok.chat_template = TEMPLATE
