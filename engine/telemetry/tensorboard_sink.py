"""TensorBoard sink (optional extra `tracking`): scalars per record, events as text summaries."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from engine.telemetry.sinks import scalar_items

STEP_KEY = "training/global_step"


def tensorboard_available() -> bool:
    """True when `torch.utils.tensorboard` can import (it needs the `tensorboard` package)."""
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardSink:
    """Writes every numeric scalar of a record with `global_step = record[step_key]` (`training/global_step`,
    or `fully_async/count/current_param_version` with `logging.aggregate = "version"`; events then use their
    `version`). Histograms (`asyncrl/is_hist`, `asyncrl/staleness_hist`) are written with `add_histogram_raw`.
    """

    def __init__(self, log_dir: str | Path, step_key: str = STEP_KEY) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer: Any = SummaryWriter(log_dir=str(log_dir))
        self.step_key = step_key

    def write_metrics(self, record: dict[str, Any]) -> None:
        if self._writer is None:
            return
        step = int(record.get(self.step_key) or 0)
        for key, value in scalar_items(record):
            self._writer.add_scalar(key, value, global_step=step)
        for key, value in record.items():
            if isinstance(value, dict) and "edges" in value and "counts" in value:
                self._write_histogram(key, value["edges"], value["counts"], step)

    def _write_histogram(self, key: str, edges: list[float], counts: list[float], step: int) -> None:
        total = float(sum(counts))
        if total <= 0 or len(edges) != len(counts) + 1:
            return
        centers = [(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
        mean = sum(c * n for c, n in zip(centers, counts, strict=True)) / total
        sum_sq = sum(c * c * n for c, n in zip(centers, counts, strict=True))
        self._writer.add_histogram_raw(
            key,
            min=edges[0],
            max=edges[-1],
            num=total,
            sum=mean * total,
            sum_squares=sum_sq,
            bucket_limits=list(edges[1:]),
            bucket_counts=list(counts),
            global_step=step,
        )

    def write_event(self, event: dict[str, Any]) -> None:
        if self._writer is None:
            return
        step = int(event.get("step" if self.step_key == STEP_KEY else "version") or 0)
        self._writer.add_text(f"events/{event.get('kind', 'event')}", str(event.get("message", "")), step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
