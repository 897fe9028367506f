"""`launch`, `status`, `ctl`, `attach` resolve runs through the registry of live runs (no Ray needed here:
the entries point at an address nobody listens on, so reaching it proves which address a command used)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app
from engine.control import registry as reg

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "presets" / "runs" / "tiny-cpu.toml"
DEAD_ADDRESS = "127.0.0.1:1"  # refused at once
cli = CliRunner()


@pytest.fixture(autouse=True)
def _no_ray_connection() -> None:
    """These commands run as a fresh `asyncrl` process would: with no Ray connection left by an earlier test."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def invoke(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.fixture
def two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[reg.RunEntry, reg.RunEntry]:
    from engine.control.client import ray_connected

    if ray_connected():
        pytest.skip("this process holds a Ray connection: commands would use it instead of the registry")
    monkeypatch.setenv(reg.STATE_ENV, str(tmp_path / "state"))
    a = reg.claim("tiny-cpu", run_dir=str(tmp_path / "runs" / "tiny-cpu"), address=DEAD_ADDRESS)
    b = reg.claim("tiny-cpu", allow_same_name=True, run_dir=str(tmp_path / "runs" / "tiny-cpu-2"),
                  address="127.0.0.1:2")
    return a, b


def test_a_second_launch_of_a_live_name_is_refused_before_anything_starts(
    two_runs: tuple[reg.RunEntry, reg.RunEntry], tmp_path: Path
) -> None:
    a, _ = two_runs
    t0 = time.monotonic()
    code, out = invoke("launch", TINY, "--set", f'logging.run_dir="{tmp_path / "new"}"')
    assert code == 1, out
    line = [ln for ln in out.splitlines() if "already live" in ln]
    assert len(line) == 1 and a.id in line[0] and a.run_dir in line[0] and "--allow-same-name" in line[0]
    assert "--name" in line[0]
    assert time.monotonic() - t0 < 30 and not (tmp_path / "new").exists()  # refused before the run dir


def test_status_without_run_lists_every_live_run_of_this_machine(
    two_runs: tuple[reg.RunEntry, reg.RunEntry],
) -> None:
    a, b = two_runs
    code, out = invoke("status", "--json")
    assert code == 0, out
    runs = json.loads(out)["runs"]
    assert [(r["id"], r["run_dir"], r["address"]) for r in runs] == [
        (a.id, a.run_dir, a.address), (b.id, b.run_dir, b.address)]
    code, human = invoke("status")
    assert code == 0 and a.id in human and b.id in human


@pytest.mark.parametrize("verb", [("ctl", "{q}", "set", "trigger_parameter_sync_step", "2"),
                                  ("status", "{q}"), ("attach", "{q}", "--json", "--once")])
def test_a_shared_name_is_refused_listing_the_candidates(
    two_runs: tuple[reg.RunEntry, reg.RunEntry], verb: tuple[str, ...]
) -> None:
    a, b = two_runs
    code, out = invoke(*(v.format(q="tiny-cpu") for v in verb))
    assert code == 2, out
    for e in (a, b):
        assert e.id in out and e.run_dir in out
    assert "started" in out


@pytest.mark.parametrize(
    "args",
    [("ctl", "{id}", "set", "trigger_parameter_sync_step", "2"),
     ("ctl", "{id}", "pause", "--json"),
     ("status", "{id}"),
     ("attach", "{id}", "--json", "--once")],
)
def test_an_id_prefix_reaches_that_runs_own_address(
    two_runs: tuple[reg.RunEntry, reg.RunEntry], args: tuple[str, ...]
) -> None:
    a, _ = two_runs
    code, out = invoke(*(x.format(id=a.id[:-2]) for x in args))
    assert code == 4, out
    assert f"no Ray cluster reachable at {DEAD_ADDRESS}" in out


@pytest.mark.parametrize(
    "args",
    [("ctl", "--address", "127.0.0.1:3", "tiny", "set", "trigger_parameter_sync_step", "2"),
     ("ctl", "tiny", "--address", "127.0.0.1:3", "set", "trigger_parameter_sync_step", "2"),
     ("ctl", "tiny", "set", "trigger_parameter_sync_step", "2", "--address", "127.0.0.1:3"),
     ("ctl", "tiny", "--address", "127.0.0.1:3", "--json", "stop", "--yes")],
)
def test_options_work_before_or_after_the_sub_verb(args: tuple[str, ...]) -> None:
    code, out = invoke(*args)
    assert code == 4, out
    assert "no Ray cluster reachable at 127.0.0.1:3" in out


def test_a_run_still_starting_and_an_unknown_run_are_exit_4(
    two_runs: tuple[reg.RunEntry, reg.RunEntry],
) -> None:
    starting = reg.claim("fresh", run_dir="/runs/fresh")
    code, out = invoke("ctl", "fresh", "pause")
    assert code == 4 and "still starting" in out and starting.id in out
    code, out = invoke("status", "nope")
    assert code == 4 and "no run named 'nope'" in out and "--address" in out


def test_listing_the_live_runs_reads_the_registry_without_importing_ray(
    two_runs: tuple[reg.RunEntry, reg.RunEntry],
) -> None:
    import os
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from asyncrl_cli.app import app; "
            "r = CliRunner().invoke(app, ['status', '--json']); print(r.output); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                         cwd=REPO, timeout=60).stdout
    assert two_runs[0].id in out and out.strip().endswith("False"), out
