"""Built-in tasks, generated deterministically from a seed, in verl's parquet row layout.

Tasks:
- `copy`: prompt `copy 381=` → ground truth `381` (3 digits, `000`–`999`).
- `reverse`: prompt `rev 381=` → ground truth `183`.
- `lookup` (multi-turn, tools): prompt `secret=` → ground truth a random 3-digit secret that is only known
  to the row's `lookup` tool (`extra_info.tools_kwargs.lookup.create_kwargs.secret`, verl's layout): the
  model must call the tool (a turn `lookup`, the `bare` tool-call format) and copy its answer. Without the
  tool a response is right by chance (1 in 1000).
- `arith`: single-digit +/− word problems for SmolLM2-135M-Instruct (addition: a, b ∈ 1..9; subtraction:
  a ∈ 5..19, b ∈ 1..9, b < a; 8 names × 8 items), asked with a one-shot gsm8k-style chat prompt
  (system message + one example user/assistant turn + the question); ground truth the number.
- `bigarith` / `bigarith-tools`: multi-digit word problems SmolLM2-135M cannot solve in its head (3-digit
  + and −, 2-digit ×; a fixed seeded pool of `BIGARITH_POOL` facts × names × items), ground truth the number.
  The two share their problems and splits (same pool, same permutation) and differ only in the one-shot
  prompt: `bigarith` shows the sum worked in the answer, `bigarith-tools` shows a Hermes `calculator` call,
  its answer and the final `#### N` (for `[rollout.multi_turn]` runs with the `calculator` tool).
- `figures` (multimodal): a geometry figure drawn with Pillow and a question with a numeric answer
  (`engine.data.figures`); rows carry an `images` column (one PNG each) and an `<image>` marker, as geo3k.

`copy`/`reverse` prompts are a single user message whose content is the plain text; a tokenizer without a
chat template renders it unchanged, so the tiny model sees exactly `copy 381=`.

Splits are disjoint by construction: each task's item pool is permuted with a seeded RNG, the first
`VAL_RESERVE[task]` items are reserved for validation (a val split of size k is the first k of them), and the
train split draws only from the rest. A train split larger than its pool cycles through fresh seeded
permutations of the pool (items repeat, never leak from val).

Row layout (one dict per row, as verl's preprocessed datasets):
`data_source: str`, `prompt: list[{"role", "content"}]`, `ability: str`,
`reward_model: {"style": "rule", "ground_truth": str}`, `extra_info: {"split": str, "index": int}`, and for
`figures` `images: list[{"bytes": png, "path": None}]` (Hugging Face `datasets`' Image layout).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.data.figures import Figure

BUILTIN_TASKS: tuple[str, ...] = ("copy", "reverse", "arith", "lookup", "bigarith", "bigarith-tools")
"""The text tasks."""
MULTIMODAL_TASKS: tuple[str, ...] = ("figures",)
"""Tasks whose rows carry images (in the `images` column); their prompt texts repeat across items."""
ALL_TASKS: tuple[str, ...] = BUILTIN_TASKS + MULTIMODAL_TASKS
SHARED_POOL: dict[str, str] = {"bigarith-tools": "bigarith"}
"""Tasks that are another task's problems under another prompt: same pool, same splits, same data source."""
DATA_SOURCES: dict[str, str] = {name: f"asyncrl/{SHARED_POOL.get(name, name)}" for name in ALL_TASKS}
ABILITY: dict[str, str] = {"copy": "copy", "reverse": "reverse", "arith": "math", "figures": "math",
                           "lookup": "tool", "bigarith": "math", "bigarith-tools": "math"}
VAL_RESERVE: dict[str, int] = {"copy": 100, "reverse": 100, "arith": 512, "figures": 64, "lookup": 100,
                               "bigarith": 256, "bigarith-tools": 256}
"""Items set aside for validation (upper bound on `val_size`)."""
DEFAULT_SIZES: dict[str, tuple[int, int]] = {"copy": (900, 64), "reverse": (900, 64), "arith": (2048, 64),
                                             "figures": (482, 32), "lookup": (900, 64), "bigarith": (2048, 64),
                                             "bigarith-tools": (2048, 64)}
"""(train_size, val_size) used when the config leaves them unset."""

LOOKUP_PROMPT = "secret="
LOOKUP_CALL = "lookup"
"""What the model writes to call the `lookup` tool (the `bare` format: a turn that is the tool's name)."""
COPY_PREFIX = "copy"
REVERSE_PREFIX = "rev"
N_DIGITS = 3

ARITH_SYSTEM = "Solve the math problem. Think briefly, then end your reply with '#### <number>'."
ARITH_EXAMPLE_USER = "Sara has 12 pens and buys 5 more. How many pens does Sara have now?"
ARITH_EXAMPLE_ASSISTANT = "Sara has 12 + 5 = 17 pens.\n#### 17"
ARITH_NAMES: tuple[str, ...] = ("Tom", "Anna", "Ben", "Lily", "Max", "Emma", "Sam", "Mia")
ARITH_ITEMS: tuple[tuple[str, str], ...] = (
    ("apple", "apples"),
    ("book", "books"),
    ("marble", "marbles"),
    ("card", "cards"),
    ("cookie", "cookies"),
    ("pencil", "pencils"),
    ("sticker", "stickers"),
    ("toy car", "toy cars"),
)

BIGARITH_POOL = 4096
BIGARITH_SYSTEM = "Solve the math problem. End your reply with '#### <number>'."
BIGARITH_TOOL_SYSTEM = (
    "Solve the math problem. Do not compute in your head: call the calculator tool with "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "<expression>"}}</tool_call>, '
    "wait for its answer, then end your reply with '#### <number>'."
)
BIGARITH_EXAMPLE_USER = "Sara has 125 pens and buys 348 more. How many pens does Sara have now?"
BIGARITH_EXAMPLE_ANSWER = "Sara has 125 + 348 = 473 pens.\n#### 473"
BIGARITH_EXAMPLE_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "125 + 348"}}\n</tool_call>'
BIGARITH_EXAMPLE_FINAL = "Sara has 473 pens.\n#### 473"

Row = dict[str, Any]


def copy_prompt(digits: str) -> str:
    """The plain-text copy prompt, e.g. `copy 381=`."""
    return f"{COPY_PREFIX} {digits}="


def reverse_prompt(digits: str) -> str:
    """The plain-text reverse prompt, e.g. `rev 381=` (answer `183`)."""
    return f"{REVERSE_PREFIX} {digits}="


def arith_question(name: str, item: tuple[str, str], a: int, b: int, op: str) -> str:
    """One word problem: `op` is "+" (buys b more) or "-" (gives away b)."""
    singular, plural = item
    noun = singular if a == 1 else plural
    if op == "+":
        return f"{name} has {a} {noun} and buys {b} more. How many {plural} does {name} have now?"
    return f"{name} has {a} {noun} and gives away {b}. How many {plural} does {name} have left?"


def arith_messages(question: str) -> list[dict[str, str]]:
    """The one-shot chat prompt: our system message, the example turn, then the question."""
    return [
        {"role": "system", "content": ARITH_SYSTEM},
        {"role": "user", "content": ARITH_EXAMPLE_USER},
        {"role": "assistant", "content": ARITH_EXAMPLE_ASSISTANT},
        {"role": "user", "content": question},
    ]


def bigarith_question(name: str, item: tuple[str, str], a: int, b: int, op: str) -> str:
    """One multi-digit word problem: "+" buys b more, "-" gives away b, "*" has a boxes of b items each."""
    singular, plural = item
    if op == "+":
        return f"{name} has {a} {plural} and buys {b} more. How many {plural} does {name} have now?"
    if op == "-":
        return f"{name} has {a} {plural} and gives away {b}. How many {plural} does {name} have left?"
    return f"{name} has {a} boxes with {b} {plural} in each box. How many {plural} does {name} have?"


def bigarith_messages(question: str, tools: bool) -> list[dict[str, str]]:
    """The one-shot chat prompt of `bigarith` (`tools`: of `bigarith-tools`, whose example calls the tool)."""
    if not tools:
        return [{"role": "system", "content": BIGARITH_SYSTEM}, {"role": "user", "content": BIGARITH_EXAMPLE_USER},
                {"role": "assistant", "content": BIGARITH_EXAMPLE_ANSWER}, {"role": "user", "content": question}]
    return [{"role": "system", "content": BIGARITH_TOOL_SYSTEM}, {"role": "user", "content": BIGARITH_EXAMPLE_USER},
            {"role": "assistant", "content": BIGARITH_EXAMPLE_CALL}, {"role": "tool", "content": "473"},
            {"role": "assistant", "content": BIGARITH_EXAMPLE_FINAL}, {"role": "user", "content": question}]


def _bigarith_facts() -> list[tuple[str, tuple[str, str], int, int, str]]:
    """The fixed pool (name, item, a, b, op): a third each of 3-digit sums, 3-digit differences, 2-digit
    products, drawn once with a fixed seed (the splits permute it per data seed)."""
    rng = random.Random("asyncrl:bigarith:pool")
    facts: list[tuple[str, tuple[str, str], int, int, str]] = []
    seen: set[tuple[int, int, str]] = set()  # no two items share their numbers (splits stay disjoint)
    while len(facts) < BIGARITH_POOL:
        name, item = rng.choice(ARITH_NAMES), rng.choice(ARITH_ITEMS)
        op = "+-*"[len(facts) % 3]
        if op == "*":
            a, b = rng.randint(11, 99), rng.randint(11, 99)
        else:
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            if op == "-" and b > a:
                a, b = b, a
        if (a, b, op) not in seen:
            seen.add((a, b, op))
            facts.append((name, item, a, b, op))
    return facts


def _bigarith_items(tools: bool) -> list[tuple[list[dict[str, str]], str]]:
    items = []
    for name, item, a, b, op in _bigarith_facts():
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        items.append((bigarith_messages(bigarith_question(name, item, a, b, op), tools), str(answer)))
    return items


def _digit_items(task: str) -> list[tuple[list[dict[str, str]], str]]:
    items = []
    for k in range(10**N_DIGITS):
        digits = f"{k:0{N_DIGITS}d}"
        if task == "copy":
            items.append(([{"role": "user", "content": copy_prompt(digits)}], digits))
        elif task == "lookup":
            items.append(([{"role": "user", "content": LOOKUP_PROMPT}], digits))
        else:
            items.append(([{"role": "user", "content": reverse_prompt(digits)}], digits[::-1]))
    return items


def _arith_facts() -> list[tuple[int, int, str]]:
    """All (a, b, op) operand pairs: 81 additions and 120 subtractions."""
    facts = [(a, b, "+") for a in range(1, 10) for b in range(1, 10)]
    facts += [(a, b, "-") for a in range(5, 20) for b in range(1, 10) if b < a]
    return facts


def _arith_items() -> list[tuple[list[dict[str, str]], str]]:
    items = []
    for a, b, op in _arith_facts():
        answer = a + b if op == "+" else a - b
        for name in ARITH_NAMES:
            for item in ARITH_ITEMS:
                items.append((arith_messages(arith_question(name, item, a, b, op)), str(answer)))
    return items


Item = tuple[list[dict[str, str]], str, "Figure | None"]
"""(messages, ground truth, figure to draw or None)."""


def _pool(name: str) -> list[Item]:
    if name == "figures":
        from engine.data.figures import all_figures, figure_messages

        return [(figure_messages(f), str(f.answer), f) for f in all_figures()]
    if name in ("bigarith", "bigarith-tools"):
        items = _bigarith_items(tools=name == "bigarith-tools")
    else:
        items = _arith_items() if name == "arith" else _digit_items(name)
    return [(messages, truth, None) for messages, truth in items]


def _check_name(name: str) -> None:
    if name not in ALL_TASKS:
        raise ValueError(f"unknown built-in dataset {name!r}; choose one of {', '.join(ALL_TASKS)}")


def default_size(name: str, split: str) -> int:
    """The number of rows of `split` ("train" | "val") when the config does not set a size."""
    _check_name(name)
    train, val = DEFAULT_SIZES[name]
    return train if split == "train" else val


def builtin_rows(name: str, split: str, seed: int = 0, size: int | None = None) -> list[Row]:
    """The rows of built-in dataset `name`, split "train" or "val", for `seed`; `size` None = default.

    Deterministic: the same (name, split, seed, size) always gives the same rows; train and val of the same
    seed never share a prompt.
    """
    _check_name(name)
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    n = default_size(name, split) if size is None else size
    if n < 0:
        raise ValueError(f"size must be >= 0, got {n}")
    items = _pool(name)
    rng = random.Random(f"asyncrl:{SHARED_POOL.get(name, name)}:{seed}")
    rng.shuffle(items)
    reserve = VAL_RESERVE[name]
    if split == "val":
        if n > reserve:
            raise ValueError(f"val_size {n} exceeds the {reserve} validation items of {name!r}")
        chosen = items[:n]
    else:
        pool = items[reserve:]
        chosen = []
        while len(chosen) < n:  # more rows than the pool: continue with a fresh permutation of it
            chosen.extend(pool[: n - len(chosen)])
            rng.shuffle(pool)
    return [_row(name, split, i, messages, truth, fig) for i, (messages, truth, fig) in enumerate(chosen)]


def _row(name: str, split: str, index: int, messages: list[dict[str, str]], truth: str,
         figure: Figure | None = None) -> Row:
    row: Row = {
        "data_source": DATA_SOURCES[name],
        "prompt": [dict(m) for m in messages],
        "ability": ABILITY[name],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index},
    }
    if name == "lookup":
        row["extra_info"]["tools_kwargs"] = {"lookup": {"create_kwargs": {"secret": truth}}}
    if figure is not None:
        from engine.data.figures import render_png

        row["images"] = [{"bytes": render_png(figure), "path": None}]
    return row


def write_dataset(
    name: str,
    out_dir: str | Path,
    seed: int = 0,
    train_size: int | None = None,
    val_size: int | None = None,
) -> dict[str, Path]:
    """Write `train.parquet` and `val.parquet` for built-in dataset `name` under `out_dir`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for split, size in (("train", train_size), ("val", val_size)):
        rows = builtin_rows(name, split, seed=seed, size=size)
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths[split] = path
    return paths


def corpus_texts(tasks: tuple[str, ...] = BUILTIN_TASKS) -> list[str]:
    """Every distinct piece of text the built-in prompts and answers of `tasks` are made of, sorted.

    Used to train the tiny tokenizer, so that it encodes every built-in prompt without `<unk>`.
    """
    texts: set[str] = set()
    for name in tasks:
        _check_name(name)
        if name == "figures":
            from engine.data.figures import corpus_texts as figure_texts

            texts.update(figure_texts())
        elif name in ("bigarith", "bigarith-tools"):
            for messages, truth in _bigarith_items(tools=name == "bigarith-tools"):
                texts.update(m["content"] for m in messages)
                texts.add(f"#### {truth}")
        elif name == "arith":
            texts.update((ARITH_SYSTEM, ARITH_EXAMPLE_USER, ARITH_EXAMPLE_ASSISTANT))
            for a, b, op in _arith_facts():
                for person in ARITH_NAMES:
                    for item in ARITH_ITEMS:
                        texts.add(arith_question(person, item, a, b, op))
                texts.add(f"#### {a + b if op == '+' else a - b}")
        else:
            for messages, truth in _digit_items(name):
                texts.update(m["content"] for m in messages)
                texts.add(truth)
            if name == "lookup":
                texts.update((LOOKUP_CALL, "\n<tool_response>\n", "\n</tool_response>\n", "Error: "))
    return sorted(texts)
