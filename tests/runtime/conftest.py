"""The shells of `engine/runtime` in one process, without Ray: each test builds a shell from its real role spec (the
tiny-cpu preset) and its in-process peers (`engine.runtime.peers_local`: the real `MessageQueueCore`, the real
`ControllerCore`, real replica shells), and no test here may start Ray (`no_ray_started`, autouse) — the shells
reach their peers only through the peers interface (`engine.runtime.peers`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


@pytest.fixture(autouse=True)
def no_ray_started():
    """Fails a test during which Ray was started (in a suite run another folder may have imported Ray; these tests
    must not initialise it)."""
    before = _ray_up()
    yield
    assert before or not _ray_up(), "a tests/runtime test started Ray: a shell reached a peer around the peers interface"


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@pytest.fixture()
def tiny_roles(tmp_path: Path):
    """`roles(*sets, resume=None)`: the tiny-cpu run's config (with `sets`) and its bound role specs, run dir
    `tmp_path/run`; the model is the preset's tiny model."""
    from asyncrl_cli.config import load_run_config
    from engine.models.loader import resolve_model_path
    from engine.plan.roles import RunIdentity
    from engine.plan.run_plan import resolve_plan

    def roles(*sets: str, resume: dict | None = None) -> tuple[Any, Any]:
        cfg = load_run_config(TINY, [f'logging.run_dir="{tmp_path / "run"}"', *sets]).config
        model = str(resolve_model_path(cfg.model.path, seed=cfg.trainer.seed))
        identity = RunIdentity("test", cfg.name, str(tmp_path / "run"), model)
        return cfg, resolve_plan(cfg).role_specs().bind(identity, trainer_resume=resume)

    return roles


@pytest.fixture()
def torch_threads():
    """A replica shell sets this process's torch threads (its own process's, under Ray): put them back after."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
