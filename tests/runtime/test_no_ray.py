"""The shells and their in-process peers import no Ray: a fresh interpreter that imports them (and builds the
in-process peers) has no `ray` module loaded, so `tests/runtime` exercises the shells without Ray by construction,
not by patching it. The Ray actors (`engine.runtime.actors`) and the Ray peers are the only way in to Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELLS = ["engine.runtime.trainer_actor", "engine.runtime.trainer_sync", "engine.runtime.rollouter",
          "engine.runtime.rollouter_report", "engine.runtime.rollouter_checkpoint", "engine.runtime.replica_calls",
          "engine.runtime.replica_pool", "engine.runtime.replica", "engine.runtime.queue", "engine.runtime.peers",
          "engine.runtime.peers_local", "engine.persist.trainer_checkpoints"]


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(m for m in "
                          "sys.modules if m == 'ray' or m.startswith('ray.'))))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_the_shells_and_the_in_process_peers_load_no_ray() -> None:
    code = "\n".join(f"import {m}" for m in SHELLS) + (
        "\nfrom engine.control.core import ControllerCore\nfrom engine.runtime import peers_local\n"
        "q = peers_local.LocalQueue(4)\nc = ControllerCore('t', run_dir=None, sinks=[], config={})\n"
        "peers_local.trainer_peers(q, object(), c)\npeers_local.rollout_peers(q, c, [object()])")
    assert _loaded_after(code) == []


def test_the_ray_actors_are_where_ray_comes_in() -> None:
    """The check above can fail: importing the Ray actors loads Ray."""
    assert "ray" in _loaded_after("import engine.runtime.actors")
