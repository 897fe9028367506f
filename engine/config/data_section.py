"""The run-config's `[data]` table (`DataConfig`) and its `[data.overlong_buffer]` (pydantic v2; split from
`engine.config.sections`, which re-exports both). Pure Python + pydantic: no torch, ray or pyarrow."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.config.names import BUILTIN_DATASETS, NAMED_REWARDS
from engine.config.section import Section

_REWARD_FN = re.compile(r"^(?:[A-Za-z_][\w.]*|[^:\s]+\.py):[A-Za-z_]\w*$")
"""`module:function` or `path/to/file.py:function` (verl's `custom_reward_function.path` + `.name`)."""
_ROW_ADAPTER = re.compile(r"^[^:\s]+\.py:[A-Za-z_]\w*$")
"""`path/to/file.py:function` (`engine.data.row_adapter.SPEC`)."""


class OverlongBufferConfig(Section):
    """DAPO's soft overlong punishment (`[data.overlong_buffer]`, verl's `reward_model.overlong_buffer` /
    `reward_kwargs.overlong_buffer_cfg`; applied by the `dapo` reward manager). With L_max =
    `data.max_response_length`, L_buf = `len` and |y| the response length in tokens:
    penalty = min(0, −(|y| − (L_max − L_buf)) / L_buf · `penalty_factor`), added to the score."""

    enable: bool = False
    """Apply the penalty (verl's `overlong_buffer.enable`)."""
    len: int = Field(0, ge=0)
    """L_buf: the last `len` tokens of the budget where the penalty grows linearly to −`penalty_factor`."""
    penalty_factor: float = Field(0.0, ge=0)
    """The penalty at the full budget (|y| = L_max)."""
    log: bool = False
    """Report `overlong_reward` and `overlong` (penalty < 0) per response, as verl's reward extra info (validation
    logs their means under `val-aux/<source>/…/mean@1`)."""


class DataConfig(Section):
    """Prompts, lengths and the reward (`[data]`)."""

    train_files: list[str] = Field(min_length=1)
    """Training parquet files in verl's row layout, or one `builtin:NAME` (copy, reverse, arith)."""
    val_files: list[str] = []
    """Validation parquet files (or `builtin:NAME`); empty = no validation."""
    max_prompt_length: int = Field(512, gt=0)
    """Longest prompt in tokens; longer prompts are filtered (see `filter_overlong_prompts`)."""
    max_response_length: int = Field(512, gt=0)
    """Generation budget per response in tokens (a resumed partial rollout keeps the remaining budget)."""
    reward: str = "auto"
    """Named reward (`gsm8k`, `math`, `geo3k`, `copy`, `reverse`, `arith`), `module:function`, or `auto`
    (chosen per row by its `data_source`)."""
    reward_manager: Literal["naive", "dapo"] = "naive"
    """verl's `reward_model.reward_manager`: `naive` = the score of `reward`; `dapo` = that score plus the overlong
    penalty of `overlong_buffer` when it is enabled."""
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)
    """DAPO's overlong buffer (used by `reward_manager = "dapo"`)."""
    prompt_key: str = "prompt"
    """Column that holds the chat-format prompt."""
    image_key: str | None = None
    """Column that holds the images of a multimodal prompt (verl's `data.image_key`, e.g. `images`)."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than `max_prompt_length` instead of failing."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""
    seed: int = 0
    """Seed of the shuffle and of built-in dataset generation."""
    train_size: int | None = Field(None, gt=0)
    """Rows of a built-in training set (None = the task's default size)."""
    val_size: int | None = Field(None, gt=0)
    """Rows of a built-in validation set (None = the task's default size)."""
    val_max_samples: int | None = Field(None, gt=0)
    """Validate on at most this many prompts (None = all)."""
    row_adapter: str | None = None
    """`path/to/file.py:fn`: a function `def fn(row: dict) -> dict` the user writes, applied to every raw row of
    the parquet files when they are read (not to `builtin:` tasks) and returning the row in verl's layout
    (`prompt` messages, `data_source`, `reward_model.ground_truth`, `extra_info`) — for datasets in another
    layout (verl's `data.custom_cls`). `validate` runs it on the first rows of each file in a child process
    (`engine.data.row_adapter`)."""
    apply_chat_template_kwargs: dict[str, Any] = {}
    """Extra keyword arguments for the tokenizer's chat template (verl's `data.apply_chat_template_kwargs`, e.g.
    `{ enable_thinking = false }`): passed to every rendering — training and validation prompts and the tool
    answers of multi-turn rollouts. A key the template does not read changes nothing."""

    @field_validator("train_files", "val_files")
    @classmethod
    def _files(cls, v: list[str]) -> list[str]:
        builtin = [f for f in v if f.startswith("builtin:")]
        for f in builtin:
            if f.removeprefix("builtin:") not in BUILTIN_DATASETS:
                raise ValueError(
                    f"unknown built-in dataset {f!r}; choose one of {', '.join(BUILTIN_DATASETS)}"
                )
        if builtin and len(v) > 1:
            raise ValueError("a builtin: dataset cannot be mixed with other files")
        return v

    @model_validator(mode="after")
    def _overlong(self) -> DataConfig:
        ob = self.overlong_buffer
        if ob.enable and self.reward_manager != "dapo":
            raise ValueError('overlong_buffer.enable needs reward_manager = "dapo" (verl applies it there only)')
        if ob.enable and ob.len <= 0:
            raise ValueError("overlong_buffer.enable needs overlong_buffer.len > 0 (the penalty divides by it)")
        if ob.enable and ob.len > self.max_response_length:
            raise ValueError(f"overlong_buffer.len ({ob.len}) exceeds max_response_length "
                             f"({self.max_response_length}): every response would be penalised")
        return self

    @field_validator("row_adapter")
    @classmethod
    def _row_adapter(cls, v: str | None) -> str | None:
        if v is not None and not _ROW_ADAPTER.match(v):
            raise ValueError(f"row_adapter {v!r} is not `path/to/file.py:function` (a function "
                             "`def fn(row: dict) -> dict`)")
        return v

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: str) -> str:
        if v in NAMED_REWARDS or _REWARD_FN.match(v):
            return v
        raise ValueError(f"reward {v!r} is neither one of {', '.join(NAMED_REWARDS)} nor `module:function`")
