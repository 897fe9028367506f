"""`asyncrl data prepare geo3k --from DIR`: a local copy of the Geometry3K dataset → verl's geo3k parquet.

Input: the Hugging Face dataset `hiyouga/geometry3k` as downloaded (`DIR/data/{train,validation,test}-*.parquet`,
or any `*.parquet` whose file name or parent directory starts with the split name), with columns `problem`
(text with one `<image>` marker per figure), `answer`, and `images` (a list of `{"bytes", "path"}` images).

Output (`OUT/{split}.parquet`, one row per problem, verl's layout as `examples/data_preprocess/geo3k.py`
writes it): `data_source = "hiyouga/geometry3k"`, `prompt = [{"role": "user", "content": problem + " " +
INSTRUCTION}]`, `images` (unchanged), `ability = "math"`, `reward_model = {"style": "rule",
"ground_truth": answer}`, `extra_info = {"split", "index", "answer", "question"}`. The instruction asks for
reasoning inside `<think> </think>` and the answer in `\\boxed{}`: the format the `geo3k` reward scores.

Rows whose images are unreadable or break the size limits, or whose `<image>` markers do not match their
images, are skipped and counted per split (`skipped_bad_image`, `skipped_image_mismatch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.data.parquet import DataError
from engine.multimodal.images import ImageError, cell_bytes, open_image
from engine.multimodal.placeholders import count_placeholders

GEO3K_SOURCE = "hiyouga/geometry3k"
SPLITS: tuple[str, ...] = ("train", "validation", "test")
REQUIRED_COLUMNS: tuple[str, ...] = ("problem", "answer", "images")
INSTRUCTION = (
    "Reason about the problem step by step inside <think> </think> tags first, then put the final answer "
    "in \\boxed{}."
)


def find_split_files(src: str | Path) -> dict[str, list[Path]]:
    """Parquet files of each split under `src` (by file-name prefix, else parent directory name)."""
    root = Path(src).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: not a directory (expected a local copy of {GEO3K_SOURCE})")
    found: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.parquet")):
        for split in SPLITS:
            if path.name.startswith(split) or path.parent.name.startswith(split):
                found.setdefault(split, []).append(path)
                break
    if not found:
        raise DataError(f"{root}: no train/validation/test parquet files (expected e.g. data/train-*.parquet)")
    return found


def convert_row(raw: dict[str, Any], split: str, index: int, origin: str) -> dict[str, Any]:
    """One verl-layout row from a Geometry3K record; `ImageError` / `ValueError` for an unusable one."""
    problem = str(raw["problem"])
    images = list(raw["images"] or [])
    marks = count_placeholders(problem)
    if marks != len(images):
        raise ValueError(f"{origin}: {marks} <image> marker(s) for {len(images)} image(s)")
    for item in images:
        open_image(cell_bytes(item))
    answer = str(raw["answer"])
    return {
        "data_source": GEO3K_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "images": [{"bytes": cell_bytes(item), "path": None} for item in images],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def prepare_geo3k(src: str | Path, out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Convert every split found under `src` into `out_dir/{split}.parquet`; returns per split the `path`,
    `rows` written and the skipped counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, dict[str, Any]] = {}
    for split, files in find_split_files(src).items():
        rows: list[dict[str, Any]] = []
        skipped = {"skipped_bad_image": 0, "skipped_image_mismatch": 0}
        for path in files:
            names = set(pq.read_schema(path).names)
            missing = [c for c in REQUIRED_COLUMNS if c not in names]
            if missing:
                raise DataError(f"{path}: missing column(s) {', '.join(missing)} (columns: {', '.join(sorted(names))};"
                                f" is this {GEO3K_SOURCE}?)")
            for i, raw in enumerate(pq.read_table(path, columns=list(REQUIRED_COLUMNS)).to_pylist()):
                try:
                    rows.append(convert_row(raw, split, len(rows), f"{path}#{i}"))
                except ImageError:
                    skipped["skipped_bad_image"] += 1
                except ValueError:
                    skipped["skipped_image_mismatch"] += 1
        target = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), target)
        report[split] = {"path": str(target), "rows": len(rows), **skipped}
    return report
