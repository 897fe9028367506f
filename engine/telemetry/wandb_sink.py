"""Weights & Biases sink (optional extra `tracking`): one `wandb.log` per record, warnings as alerts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

STEP_KEY = "training/global_step"


def wandb_available() -> bool:
    """True when the `wandb` package can import."""
    return importlib.util.find_spec("wandb") is not None


class WandbSink:
    """Logs records with `step = record[step_key]` (`training/global_step`, or the parameter version with
    `logging.aggregate = "version"`); histograms become `wandb.Histogram(np_histogram=...)`.

    W&B's own mode settings (`WANDB_MODE=offline`, API key) apply unchanged.
    """

    def __init__(
        self, project: str, run_name: str, config: dict[str, Any], run_dir: str | Path | None,
        step_key: str = STEP_KEY,
    ) -> None:
        import wandb

        self.step_key = step_key
        self._wandb: Any = wandb
        self._run: Any = wandb.init(
            project=project,
            name=run_name,
            config=config,
            dir=str(run_dir) if run_dir else None,
            reinit=True,
        )

    def write_metrics(self, record: dict[str, Any]) -> None:
        if self._run is None:
            return
        row: dict[str, Any] = {}
        for key, value in record.items():
            if isinstance(value, dict) and "edges" in value and "counts" in value:
                row[key] = self._wandb.Histogram(np_histogram=(value["counts"], value["edges"]))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = value
        step = record.get(self.step_key)
        self._run.log(row, step=int(step) if step is not None else None)

    def write_event(self, event: dict[str, Any]) -> None:
        if self._run is None:
            return
        if event.get("level") in ("warning", "error"):
            self._run.alert(title=str(event.get("kind", "event")), text=str(event.get("message", "")))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
