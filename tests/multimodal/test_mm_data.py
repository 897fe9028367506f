"""Multimodal data: the built-in figure task, geo3k-layout parquet with images, vision-token expansion, and
bad rows (corrupt images, missing image columns, placeholder/image mismatches) with counters and messages."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mm_helpers import png_bytes

from engine.data.builtin import builtin_rows, write_dataset
from engine.data.parquet import DataError
from engine.data.prompts import load_prompts
from engine.multimodal.placeholders import image_runs


def _row(content: str, images: list[Any] | None, truth: str = "4") -> dict[str, Any]:
    row: dict[str, Any] = {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": content}],
                           "reward_model": {"style": "rule", "ground_truth": truth}}
    if images is not None:
        row["images"] = images
    return row


def _write(tmp_path: Path, rows: list[dict[str, Any]], name: str = "d.parquet") -> str:
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _cfg(files: list[str], **kw: Any) -> dict[str, Any]:
    return {"train_files": files, "image_key": "images", "max_prompt_length": 256, **kw}


def test_figure_rows_are_geo3k_layout_and_deterministic() -> None:
    rows = builtin_rows("figures", "train", seed=3, size=12)
    assert rows == builtin_rows("figures", "train", seed=3, size=12)
    for r in rows:
        assert r["prompt"][0]["content"].startswith("<image>Find ")
        assert r["data_source"] == "asyncrl/figures" and r["reward_model"]["ground_truth"].isdigit()
        assert len(r["images"]) == 1 and r["images"][0]["bytes"].startswith(b"\x89PNG")
    val = builtin_rows("figures", "val", seed=3, size=64)
    key = lambda r: (r["prompt"][0]["content"], r["images"][0]["bytes"])
    assert {key(r) for r in val}.isdisjoint(key(r) for r in builtin_rows("figures", "train", seed=3, size=600))


def test_prompt_ids_expand_each_image_to_its_vision_tokens(vl_tokenizer: Any, encoder: Any, tmp_path: Path) -> None:
    prompts, counters = load_prompts({"train_files": ["builtin:figures"], "train_size": 6}, vl_tokenizer)
    assert counters["kept"] == 6 and counters["filtered_image_mismatch"] == 0
    image_id = encoder.spec.image_token_id
    for p in prompts:
        pixels, grid = encoder.features(p.images[0])  # the processor's own grid agrees with the count
        assert image_runs(p.prompt_ids, image_id) == [encoder.spec.tokens_for_grid(grid)] == [9]
        assert pixels.shape[0] == 36
    # two images of different sizes in one prompt, from a parquet file (one as a path next to the file)
    big, small = png_bytes(160, 96), png_bytes(40, 40)
    (tmp_path / "small.png").write_bytes(small)
    path = _write(tmp_path, [_row("Find <image> and <image>.", [{"bytes": big, "path": None},
                                                                   {"bytes": None, "path": "small.png"}])])
    (p,), _ = load_prompts(_cfg([path]), vl_tokenizer)
    runs = image_runs(p.prompt_ids, image_id)
    assert runs == [encoder.tokens(img) for img in p.images] and runs[0] > runs[1]
    text = vl_tokenizer.decode(p.prompt_ids)
    assert text.startswith("<|im_start|>user\nFind <|vision_start|><|image_pad|>")
    assert text.endswith("<|im_start|>assistant\n")


def test_missing_image_column_is_a_clear_error(vl_tokenizer: Any, tmp_path: Path) -> None:
    path = _write(tmp_path, [_row("<image>Find x.", None)])
    with pytest.raises(DataError, match=r"missing image column 'images' \(data.image_key"):
        load_prompts(_cfg([path]), vl_tokenizer)


def test_corrupt_images_are_counted_and_dropped(vl_tokenizer: Any, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    good = {"bytes": png_bytes(64, 64), "path": None}
    rows = [_row("<image>Find x.", [good]), _row("<image>Find y.", [{"bytes": b"garbage", "path": None}]),
            _row("<image>Find z.", [{"bytes": png_bytes(64, 64)[:-30], "path": None}]),
            _row("<image>Find w.", [{"bytes": None, "path": "nowhere.png"}])]
    path = _write(tmp_path, rows)
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        prompts, counters = load_prompts(_cfg([path]), vl_tokenizer)
    assert len(prompts) == 1 and counters["filtered_bad_image"] == 3 and counters["kept"] == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"{path}#1: bad image: corrupt or unsupported image" in warnings[0]
    with pytest.raises(DataError, match=rf"{path}#1: bad image: corrupt"):
        load_prompts(_cfg([path], filter_overlong_prompts=False), vl_tokenizer)


@pytest.mark.parametrize("content, n_images, detail", [
    ("Find x.", 1, "0 <image> placeholder(s) for 1 image(s)"),
    ("<image><image>Find x.", 1, "2 <image> placeholder(s) for 1 image(s)"),
    ("<image>Find x.", 0, "1 <image> placeholder(s) for 0 image(s)"),
    ("<image>Find <|image_pad|> x.", 1, "2 image token(s) in 2 place(s) for 1 image(s)"),
])
def test_placeholder_image_mismatch_is_counted_or_raised(vl_tokenizer: Any, tmp_path: Path, content: str,
                                                         n_images: int, detail: str) -> None:
    rows = [_row("<image>Fine.", [png_bytes(32, 32)]), _row(content, [png_bytes(48, 48)] * n_images)]
    path = _write(tmp_path, rows)
    prompts, counters = load_prompts(_cfg([path]), vl_tokenizer)
    assert len(prompts) == 1 and counters["filtered_image_mismatch"] == 1
    with pytest.raises(DataError, match=rf"#1: placeholders do not match the images: .*{re.escape(detail)}"):
        load_prompts(_cfg([path], filter_overlong_prompts=False), vl_tokenizer)


def test_vision_tokens_count_toward_max_prompt_length(vl_tokenizer: Any, tmp_path: Path) -> None:
    path = _write(tmp_path, [_row("<image>Find x.", [png_bytes(128, 128)])])  # 8 × 8 patches → 16 tokens
    (p,), _ = load_prompts(_cfg([path]), vl_tokenizer)
    _, counters = load_prompts(_cfg([path], max_prompt_length=len(p.prompt_ids) - 1), vl_tokenizer)
    assert counters["filtered_overlong"] == 1


def test_images_on_a_text_model_fail_at_load(tmp_path: Path) -> None:
    from engine.models.loader import load_tokenizer
    from engine.models.tiny import build_tiny_model_dir

    tok = load_tokenizer(build_tiny_model_dir(tmp_path / "text", seed=0))
    path = write_dataset("figures", tmp_path / "fig", train_size=2, val_size=1)["train"]
    with pytest.raises(DataError, match="the data has images but the model cannot take them: .*not a vision-lang"):
        load_prompts(_cfg([str(path)]), tok)


def test_images_travel_with_the_group_through_pickle_and_json(vl_tokenizer: Any) -> None:
    import json
    import pickle

    from engine.types import GenRequest, Trajectory, TrajectoryGroup

    (p,), _ = load_prompts({"train_files": ["builtin:figures"], "train_size": 1}, vl_tokenizer)
    group = TrajectoryGroup(p, [Trajectory([5, 1], [-0.5, -0.1], "stop", 0, 1, reward=0.1)])
    back = TrajectoryGroup.from_json(json.loads(json.dumps(group.to_json())))
    assert back == group and back.prompt.images == p.images
    assert pickle.loads(pickle.dumps(group)) == group
    request = GenRequest("u#0", p.prompt_ids, prefix_ids=[5], prefix_log_probs=[-0.5], images=p.images)
    assert len(pickle.dumps(request)) < 4 * len(p.images[0])  # base64 text of a ~1 KB PNG, not pixel arrays
