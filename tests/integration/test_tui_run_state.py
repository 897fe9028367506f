"""`launch --tui`: the dashboard stays open after the run ends, and it must then say FINISHED, not RUNNING."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan
from tests.integration.run_helpers import tiny_config


@pytest.mark.integration
def test_the_dashboard_sees_the_run_finished_while_it_is_still_open(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run", "trainer.total_steps=4", "trainer.test_freq=0")
    seen: list[str] = []

    def dashboard(source: Any, work: Any) -> bool:
        """Stands where the Textual app runs: polls the live source until the user would press q."""
        outcome: dict[str, bool] = {}
        thread = threading.Thread(target=lambda: outcome.update(ok=work()))
        thread.start()
        thread.join(timeout=300)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the run is over; the dashboard is still attached
            seen.append(str(source.snapshot(0, 1).get("state")))
            if seen[-1] != "running":
                break
            time.sleep(0.2)
        return outcome["ok"]

    assert run(resolve_plan(cfg), tui=dashboard, progress=False) == 0
    assert seen and seen[-1] == "finished", seen
