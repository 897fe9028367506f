"""Turn `data.train_files` / `data.val_files` into the tokenised prompt stream (`engine.types.Prompt`).

Rendering: chat messages go through the tokenizer's chat template (`add_generation_prompt=True` and
`data.apply_chat_template_kwargs`, then
tokenised without adding special tokens: the template already has them). Rows keep their own system
message, so a template that injects a default one (SmolLM2's "You are a helpful AI assistant named
SmolLM…") never does for our built-in `arith` prompts. A tokenizer without a chat template gets the message
contents joined by newlines (the tiny model sees exactly `copy 381=`), tokenised with its special tokens; a
plain-string prompt is used verbatim the same way.

Filtering: prompts that render to no tokens (`filtered_empty`) or to more than `data.max_prompt_length`
tokens (`filtered_overlong`) are dropped and counted when `data.filter_overlong_prompts`, else they raise.

Images (`data.image_key` set, or a multimodal built-in task): each `<image>` marker becomes an image item of
the message's content list for the chat template (or the model's vision block text without one), and after
tokenising each `<|image_pad|>` is expanded to its image's vision-token count (`engine.multimodal`), so
`Prompt.prompt_ids` is what the model consumes and `max_prompt_length` counts the vision tokens. Rows whose
images cannot be read or break the size limits (`filtered_bad_image`), or whose markers do not match their
images (`filtered_image_mismatch`), are dropped and counted — with one warning per kind naming the row —
when `data.filter_overlong_prompts`, else they raise `DataError`.

Order: each row's `index` is its position in the concatenated files (stable across epochs) and its uid is
`"{epoch}:{index}"`. The train split is shuffled per epoch with a generator seeded by (data.seed, epoch)
when `data.shuffle`; validation keeps file order and is cut to `data.val_max_samples`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine.data.builtin import MULTIMODAL_TASKS, builtin_rows
from engine.data.image_rows import ImageRows
from engine.data.parquet import DataError, DataRow, normalize_row, read_parquet
from engine.data.rewards import get_reward_fn
from engine.types import Prompt

if TYPE_CHECKING:
    from engine.config.sections import DataConfig

    DataSection = DataConfig | Mapping[str, Any]
    """The run config's `data` section, or a mapping with its keys (scripts, tests)."""

BUILTIN_PREFIX = "builtin:"
BUILTIN_IMAGE_KEY = "images"
"""The image column of the multimodal built-in tasks (used when `data.image_key` is unset)."""


def _get(cfg: DataSection, name: str, default: Any) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def load_rows(data_cfg: DataSection, split: str = "train") -> list[DataRow]:
    """The raw rows of a split: parquet files (through `data.row_adapter` when set) and `builtin:NAME`
    entries, in the order listed."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    specs = list(_get(data_cfg, "train_files" if split == "train" else "val_files", []) or [])
    prompt_key = _get(data_cfg, "prompt_key", "prompt")
    image_key = _get(data_cfg, "image_key", None)
    seed = int(_get(data_cfg, "seed", 0))
    size = _get(data_cfg, "train_size" if split == "train" else "val_size", None)
    rows: list[DataRow] = []
    files: list[str] = []
    adapter_spec = _get(data_cfg, "row_adapter", None)
    adapter = None

    def flush() -> None:
        nonlocal adapter
        if files:
            if adapter_spec and adapter is None:
                from engine.data.row_adapter import load_row_adapter

                adapter = load_row_adapter(adapter_spec)
            rows.extend(read_parquet(list(files), prompt_key, image_key, adapter))
            files.clear()

    for spec in specs:
        spec = str(spec)
        if spec.startswith(BUILTIN_PREFIX):
            flush()
            name = spec[len(BUILTIN_PREFIX) :]
            raw = builtin_rows(name, split, seed=seed, size=size)
            key = image_key or (BUILTIN_IMAGE_KEY if name in MULTIMODAL_TASKS else None)
            rows.extend(normalize_row(r, f"{spec}#{i}", image_key=key) for i, r in enumerate(raw))
        else:
            files.append(spec)
    flush()
    return rows


def render_prompt(prompt: list[dict[str, str]] | str, tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                  template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, bool]:
    """(text, uses_template): the chat template's rendering with the generation prompt when the
    tokenizer has one (offering `tools`, OpenAI-style schemas, to a multi-turn run; `template_kwargs` =
    `data.apply_chat_template_kwargs` passed to the template), else the contents joined by newlines (a string
    prompt is returned as is)."""
    if isinstance(prompt, str):
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                             **({"tools": tools} if tools else {}), **(template_kwargs or {}))
        return str(text), True
    return "\n".join(m["content"] for m in prompt), False


def _check_rewards(rows: list[DataRow], reward: str) -> None:
    """Fail at load time, not per sample, when the reward cannot be resolved for some data_source."""
    for source in sorted({r.data_source for r in rows}):
        try:
            get_reward_fn(reward, source)
        except ValueError as exc:
            raise DataError(f"data.reward = {reward!r}: {exc}") from exc


def load_prompts(
    data_cfg: DataSection, tokenizer: Any, split: str = "train", epoch: int = 0, image_encoder: Any = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[Prompt], dict[str, int]]:
    """The prompts of `split` for `epoch`, and counters `rows`, `kept`, `filtered_empty`,
    `filtered_overlong`, `cut_val_max_samples`, `with_unk` (kept prompts containing the unknown token: the
    tokenizer cannot represent them; worth a warning), plus `filtered_bad_image` and
    `filtered_image_mismatch` when the data has images.

    `data_cfg` is the config's `data` section (or a mapping with the same keys). Rows with images need the
    model's `engine.multimodal.vision.ImageEncoder`; by default it is loaded from the tokenizer's directory."""
    rows = load_rows(data_cfg, split)
    _check_rewards(rows, str(_get(data_cfg, "reward", "auto")))
    max_len = int(_get(data_cfg, "max_prompt_length", 512))
    filter_bad = bool(_get(data_cfg, "filter_overlong_prompts", True))
    counters = {"rows": len(rows), "kept": 0, "filtered_empty": 0, "filtered_overlong": 0,
                "cut_val_max_samples": 0, "with_unk": 0}
    unk_id = getattr(tokenizer, "unk_token_id", None)
    template_kwargs = dict(_get(data_cfg, "apply_chat_template_kwargs", None) or {})
    has_images = bool(_get(data_cfg, "image_key", None)) or any(r.images or r.image_error for r in rows)
    vision = None
    if has_images:
        counters.update(filtered_bad_image=0, filtered_image_mismatch=0)
        vision = ImageRows(tokenizer, image_encoder, filter_bad, counters, template_kwargs)

    usable = [True] * len(rows)
    image_counts: list[list[int]] = [[] for _ in rows]
    if vision is not None:
        for i, row in enumerate(rows):
            counts = vision.counts(row)
            usable[i] = counts is not None
            image_counts[i] = counts or []
    rendered: list[tuple[str, bool]] = []
    for i, r in enumerate(rows):
        if vision is not None and usable[i] and r.images:
            rendered.append(vision.render(r.prompt))
        else:
            rendered.append(render_prompt(r.prompt, tokenizer, tools, template_kwargs) if usable[i] else ("", False))
    templated = [i for i, (_, t) in enumerate(rendered) if t and usable[i]]
    plain = [i for i, (_, t) in enumerate(rendered) if not t and usable[i]]
    ids: list[list[int]] = [[] for _ in rows]
    for group, special in ((templated, False), (plain, True)):
        texts = [rendered[i][0] for i in group]
        if texts:
            encoded = tokenizer(texts, add_special_tokens=special)["input_ids"]
            for i, seq in zip(group, encoded):
                ids[i] = list(seq)

    prompts: list[Prompt] = []
    for index, (row, prompt_ids) in enumerate(zip(rows, ids)):
        if not usable[index]:
            continue
        if vision is not None and row.images:
            expanded = vision.expand(row, prompt_ids, image_counts[index])
            if expanded is None:
                continue
            prompt_ids = expanded
        text = rendered[index][0]
        if not text.strip() or not prompt_ids:
            if not filter_bad:
                raise DataError(
                    f"{row.origin}: empty prompt (set data.filter_overlong_prompts = true to skip it)"
                )
            counters["filtered_empty"] += 1
            continue
        if len(prompt_ids) > max_len:
            if not filter_bad:
                raise DataError(
                    f"{row.origin}: prompt has {len(prompt_ids)} tokens > data.max_prompt_length = {max_len} "
                    "(raise it, or set data.filter_overlong_prompts = true)"
                )
            counters["filtered_overlong"] += 1
            continue
        if unk_id is not None and unk_id in prompt_ids:
            counters["with_unk"] += 1
        prompts.append(
            Prompt(
                uid=f"{epoch}:{index}",
                index=index,
                epoch=epoch,
                prompt_ids=prompt_ids,
                ground_truth=row.ground_truth,
                data_source=row.data_source,
                extra_info=row.extra_info,
                images=list(row.images),
            )
        )

    if split == "train" and bool(_get(data_cfg, "shuffle", True)):
        random.Random(f"asyncrl:shuffle:{int(_get(data_cfg, 'seed', 0))}:{epoch}").shuffle(prompts)
    if split == "val":
        cap = _get(data_cfg, "val_max_samples", None)
        if cap is not None and len(prompts) > int(cap):
            counters["cut_val_max_samples"] = len(prompts) - int(cap)
            prompts = prompts[: int(cap)]
    counters["kept"] = len(prompts)
    return prompts, counters
