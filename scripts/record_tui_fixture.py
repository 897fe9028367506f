"""Record the dashboard's test fixture (`tests/fixtures/run_tiny/`) from a real tiny run.

Runs `presets/runs/tiny-cpu.toml` for 48 local steps on a local Ray, changes `trigger_parameter_sync_step`
4 → 2 through the same client the dashboard uses once the first sync happened, and keeps the run dir's
`metrics.jsonl`, `events.jsonl`, `config.resolved.json` and `config.provenance.json`.

    .venv/bin/python scripts/record_tui_fixture.py [OUT_DIR]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "logging.progress=false", "trainer.ppo_mini_batch_size=16", "trainer.ppo_micro_batch_size_per_gpu=64",
    "rollout.total_rollout_steps=768", "trainer.test_freq=4", "checkpoint.every_versions=8",
    "async_training.trigger_parameter_sync_step=4", "async_training.staleness_threshold=0.5",
]


def main(out: Path) -> None:
    import ray

    from asyncrl_cli.config import load_run_config
    from engine.control.client import ControlClient
    from engine.control.controller import live_run_names
    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    tmp = Path(tempfile.mkdtemp()) / "run"
    loaded = load_run_config(REPO / "presets/runs/tiny-cpu.toml", [f'logging.run_dir="{tmp}"', *OVERRIDES])
    cfg = loaded.config
    assert cfg is not None, [str(p) for p in loaded.problems]
    codes: list[int] = []
    driver = threading.Thread(target=lambda: codes.append(run(resolve_plan(cfg), provenance=loaded.provenance.to_json(),
                                                              progress=False)))
    driver.start()
    while not (ray.is_initialized() and cfg.name in live_run_names()) and not codes:
        time.sleep(0.2)
    client = ControlClient(cfg.name, who="alice@lab-01")
    while not codes and not any(e["kind"] == "sync" for e in client.snapshot(0)["events"]):
        time.sleep(0.2)
    version = client.get_knobs()["trigger_parameter_sync_step"]["version"]
    print(client.set_knob("trigger_parameter_sync_step", 2, expected_version=version))
    driver.join()
    assert codes == [0], codes
    out.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "events.jsonl", "config.resolved.json", "config.provenance.json"):
        shutil.copy(tmp / name, out / name)
    print(f"recorded {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests/fixtures/run_tiny")
