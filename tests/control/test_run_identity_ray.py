"""Acceptance (issue 15, items 1–3) with real launches, each its own process and private local Ray:

- a second launch of a live name exits 1 within 30 s naming the live run and its dir;
- with `--allow-same-name` both run, `ctl tiny-cpu ...` refuses listing both, and `ctl <id prefix> set ...`
  changes exactly that run (the other's knob is untouched) — also with a stale `ray_current_cluster` file
  pointing nowhere, and `status` / `attach` reach the run they name;
- `ctl <id> stop` stops only that run; the relaunch (which stepped aside into a timestamped sibling dir) is
  Ctrl-C'd, and the resume command it printed, pasted, resumes *that* run's directory, as `--resume auto`
  would.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "presets" / "runs" / "tiny-cpu.toml"
ASYNCRL = Path(sys.executable).parent / "asyncrl"
SETS = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
        "trainer.test_freq=0", "logging.progress=false", "rollout.total_rollout_steps=100000")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def wait_for(cond: Any, timeout: float, what: str, procs: tuple[subprocess.Popen, ...] = ()) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a launch exited ({p.returncode}) while waiting for {what}: {p.args}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


class Launches:
    """`asyncrl launch` processes sharing one private registry and one private Ray temp dir."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env, self.n = tmp, env, 0

    def start(self, args: list[str]) -> tuple[subprocess.Popen, Path]:
        self.n += 1
        log = self.tmp / f"launch{self.n}.log"
        proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=self.env,
                                cwd=self.tmp, start_new_session=True)
        return proc, log

    def launch(self, run_dir: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
        args = [str(ASYNCRL), "launch", str(TINY), "--set", f'logging.run_dir="{run_dir}"']
        for s in SETS:
            args += ["--set", s]
        return self.start([*args, *extra])


def entries(state: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(p.read_text()) for p in (state / "runs").glob("*.json")),
                  key=lambda e: e["started"])


def started(entry: dict[str, Any]) -> bool:
    """Registered with its Ray address, and its controller has recorded the `start` event."""
    return bool(entry.get("address") and entry.get("run_dir")) and any(
        e["kind"] == "start" for e in read_jsonl(Path(entry["run_dir"]) / "events.jsonl"))


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{proc.args} did not exit within {timeout} s") from None


def test_identity_reach_and_resume_across_two_local_runs_of_one_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    from asyncrl_cli.app import app
    from asyncrl_cli.config import load_run_config
    from engine.control.client import ray_connected
    from engine.persist.resume import find_resume_point

    if ray_connected():
        pytest.skip("needs a process without a Ray connection")
    state = tmp_path / "state"
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("ASYNCRL_STATE_DIR", str(state))
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    runs = Launches(tmp_path, env)
    run_dir = tmp_path / "runs" / "tiny-cpu"
    cli = CliRunner()

    def asyncrl(*args: str) -> tuple[int, str]:
        res = cli.invoke(app, list(args))
        assert "Traceback" not in res.output, res.output
        return res.exit_code, res.output

    procs: list[subprocess.Popen] = []
    try:
        p1, log1 = runs.launch(run_dir)
        procs.append(p1)
        first = wait_for(lambda: [e for e in entries(state) if started(e)], 300, "the first run", (p1,))[0]
        assert first["name"] == "tiny-cpu" and Path(first["run_dir"]) == run_dir.resolve()
        assert json.loads((run_dir / "run.json").read_text())["id"] == first["id"]

        # 1. the same name again: refused in seconds, naming the live run and its dir
        t0 = time.monotonic()
        p2, log2 = runs.launch(run_dir)
        assert finish(p2, 30) == 1 and time.monotonic() - t0 < 30
        refusal = [ln for ln in log2.read_text().splitlines() if "already live" in ln]
        assert len(refusal) == 1 and first["id"] in refusal[0] and first["run_dir"] in refusal[0], log2.read_text()

        # ... unless --allow-same-name: it steps aside into a timestamped sibling of the used dir
        p3, log3 = runs.launch(run_dir, "--allow-same-name")
        procs.append(p3)
        second = wait_for(lambda: [e for e in entries(state) if e["id"] != first["id"] and started(e)], 300,
                          "the second run", (p1, p3))[0]
        dir3 = Path(second["run_dir"])
        assert second["name"] == "tiny-cpu" and dir3.parent == run_dir.resolve().parent
        assert dir3.name.startswith("tiny-cpu-") and dir3 != run_dir.resolve()

        # a stale ray_current_cluster (an old `ray start`) pointing nowhere changes nothing below
        address_file = ray_tmp / "ray" / "ray_current_cluster"
        address_file.parent.mkdir(parents=True, exist_ok=True)
        address_file.write_text("127.0.0.1:9\n")

        # 2. a shared name is refused with the candidates; an id prefix reaches exactly that run
        code, out = asyncrl("ctl", "tiny-cpu", "set", "trigger_parameter_sync_step", "2")
        assert code == 2 and first["id"] in out and second["id"] in out and str(dir3) in out, out
        code, out = asyncrl("ctl", second["id"][:-2], "set", "trigger_parameter_sync_step", "2")
        assert code == 0, out
        code, out = asyncrl("status", second["id"], "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["id"] == second["id"] and doc["run_dir"] == str(dir3)
        assert doc["knobs"]["trigger_parameter_sync_step"]["value"] == 2
        code, out = asyncrl("status", "--json", first["id"][:-1])
        assert code == 0, out
        doc = json.loads(out)
        knob = doc["knobs"]["trigger_parameter_sync_step"]
        assert doc["id"] == first["id"] and (knob["value"], knob["version"]) == (1, 0)  # untouched
        code, out = asyncrl("attach", first["id"], "--json", "--once")
        assert code == 0 and json.loads(out)["run"]["id"] == first["id"], out
        code, out = asyncrl("status", "--json")
        assert code == 0 and [r["id"] for r in json.loads(out)["runs"]] == [first["id"], second["id"]], out
        assert address_file.read_text() == "127.0.0.1:9\n"

        # `ctl <id> stop` stops that run only
        code, out = asyncrl("ctl", first["id"], "--address", first["address"], "stop", "--yes")
        assert code == 0, out
        assert finish(p1, 240) == 0, log1.read_text()
        assert p3.poll() is None and [e["id"] for e in entries(state)] == [second["id"]]

        # 3. Ctrl-C the relaunch: the printed command, pasted, resumes the relaunch's own directory
        os.kill(p3.pid, signal.SIGINT)
        assert finish(p3, 240) == 130, log3.read_text()
        hint = [ln for ln in log3.read_text().splitlines() if "with: " in ln and "--resume" in ln]
        assert hint, log3.read_text()
        pasted = shlex.split(hint[-1].split("with: ", 1)[1])
        assert pasted[:2] == ["asyncrl", "launch"] and pasted[-2:] == ["--resume", str(dir3)]
        cfg = load_run_config(TINY, [f'logging.run_dir="{run_dir}"', *SETS]).config
        assert find_resume_point(cfg, "auto").run_dir == dir3  # `--resume auto` takes the same directory
        p4, log4 = runs.start([str(ASYNCRL), *pasted[1:]])
        procs.append(p4)
        resumed = wait_for(lambda: [e for e in read_jsonl(dir3 / "events.jsonl") if e["kind"] == "resume"], 300,
                           "the resume event", (p4,))
        assert resumed[0]["path"].startswith(str(dir3))
        assert not [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "resume"]
        third = wait_for(lambda: [e for e in entries(state) if started(e)], 120, "the resumed run", (p4,))[0]
        assert third["run_dir"] == str(dir3) and third["id"] not in (first["id"], second["id"])
        code, out = asyncrl("ctl", "tiny-cpu", "stop", "--yes")  # the only live tiny-cpu now: the name is enough
        assert code == 0, out
        assert finish(p4, 240) == 0, log4.read_text()
        assert entries(state) == []  # clean exits leave no registry entry
        run_file = json.loads((dir3 / "run.json").read_text())
        assert run_file["id"] == third["id"] and second["id"] in [p["id"] for p in run_file["previous"]]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
