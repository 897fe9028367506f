"""Every way a run is stopped keeps its work: `asyncrl launch` of the tiny preset as a real process, stopped as
users and schedulers stop it — Ctrl-C through `| tee` (SIGINT to the process group, `tee` dies too), a closed
terminal (SIGHUP), `nohup` (SIGHUP ignored, then SIGTERM), a scheduler's SIGTERM with a short grace period, stdout
and stderr closed (`>&- 2>&-`), output on a full file system (/dev/full). Each ends with a checkpoint (or the
light stop state it names), a `stop` event, the resume command in `<run dir>/run.log`, and `--resume auto`
finishing the run with an exact ledger. One runs in `make test` (its integration suite); the others are `slow`."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from reliability_helpers import (
    ASYNCRL,
    TINY,
    assert_ledger_exact,
    events,
    kill_session,
    overrides,
    session_pids,
    tiny_config,
    train_steps,
    wait_for,
)

from engine.persist.checkpoint import latest_valid, read_checkpoint
from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

EXTRA = ("rollout.total_rollout_steps=320", "data.max_response_length=8")
STEPS = 320 // 8


def _shell(run_dir: Path, redirect: str, *extra: str, env: dict[str, str] | None = None,
           prefix: str = "") -> subprocess.Popen:
    """`[prefix] asyncrl launch tiny ... <redirect>` in bash, its own session and process group (the foreground
    job of a terminal: a signal to the group reaches the launch, `tee` and the Ray processes the launch started)."""
    args = [str(ASYNCRL), "launch", str(TINY)]
    for s in overrides(run_dir, *EXTRA, *extra):
        args += ["--set", s]
    line = f"{prefix}{shlex.join(args)} {redirect}"
    return subprocess.Popen(["bash", "-c", line], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})})


def _stop(proc: subprocess.Popen, run_dir: Path, sig: int, group: bool = True, after_steps: int = 2) -> float:
    """Send `sig` once the run trained `after_steps` steps and wait for the launch to end; returns when it was sent."""
    wait_for(lambda: len(train_steps(run_dir)) >= after_steps, timeout=300, proc=None)
    launch = _launch_pid(proc.pid)
    sent = time.time()
    if group:
        os.killpg(proc.pid, sig)
    else:  # the launch itself
        os.kill(launch, sig)
    try:  # the launch, not bash: a SIGHUP ends bash at once
        wait_for(lambda: launch not in session_pids(proc.pid), timeout=180)
    finally:
        kill_session(proc.pid)  # nothing of the run may outlive it; and a hung stop fails here, not later
        proc.wait(timeout=30)
    return sent


def _launch_pid(sid: int) -> int:
    for pid in session_pids(sid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"asyncrl") for c in cmd[:2]) and b"launch" in cmd:
            return pid
    raise AssertionError("no asyncrl launch process found")


def _assert_stopped_and_resumable(run_dir: Path, kind: str | None = "full") -> dict:
    """A `stop` event naming what was saved, that checkpoint the newest intact one, the resume command in
    run.log; then `--resume auto` finishes with every step once and an exact ledger."""
    stops = events(run_dir, "stop")
    assert len(stops) == 1, events(run_dir)[-5:]
    stop = stops[0]
    if kind is not None:
        assert stop["saved"] == kind, stop
    ckpt = latest_valid(run_dir / "checkpoints")
    assert ckpt is not None and str(ckpt) == stop["path"]
    state = read_checkpoint(ckpt)["state"]
    assert state["reason"] == "stop" or state["step"] == stop["step"]  # a periodic one at the stop's step is it
    log = (run_dir / "run.log").read_text()
    assert f"--resume {run_dir}" in log and "stopped by SIG" in log, log
    stopped_at = stop["step"]
    assert stopped_at < STEPS

    cfg = tiny_config(run_dir, *EXTRA)
    assert run(resolve_plan(cfg), resume="auto", progress=False) == 0
    assert events(run_dir, "resume")[-1]["step"] == stopped_at
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    assert_ledger_exact(cfg, run_dir, trained=STEPS * 8)
    return stop


@pytest.mark.slow  # `make test` stops by signal in test_stop_paths.py and test_graceful_stop.py
def test_ctrl_c_through_tee_stops_with_a_checkpoint_and_resumes_exactly(tmp_path: Path) -> None:
    """`asyncrl launch RUN.toml 2>&1 | tee run.log`, Ctrl-C: `tee` exits at once, the driver's writes get EPIPE;
    the stop still checkpoints, records `stop` and writes the resume command into the run directory."""
    run_dir = tmp_path / "run"
    proc = _shell(run_dir, f"2>&1 | tee {tmp_path / 'tee.log'}")
    _stop(proc, run_dir, signal.SIGINT)
    assert "stopped by SIGINT" in (run_dir / "run.log").read_text()
    assert "stderr is gone (BrokenPipeError" in (run_dir / "run.log").read_text()
    _assert_stopped_and_resumable(run_dir)


@pytest.mark.slow
def test_a_closed_terminal_sighup_stops_with_a_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _shell(run_dir, f"2>&1 | tee {tmp_path / 'tee.log'}")
    _stop(proc, run_dir, signal.SIGHUP)
    assert "stopped by SIGHUP" in (run_dir / "run.log").read_text()
    _assert_stopped_and_resumable(run_dir)


@pytest.mark.slow
def test_under_nohup_sighup_is_ignored_and_sigterm_still_stops(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _shell(run_dir, f"> {tmp_path / 'nohup.out'} 2>&1", prefix="exec nohup ")  # bash becomes the launch
    wait_for(lambda: len(train_steps(run_dir)) >= 2, timeout=300, proc=None)
    os.killpg(proc.pid, signal.SIGHUP)
    seen = len(train_steps(run_dir))
    wait_for(lambda: len(train_steps(run_dir)) >= seen + 2, timeout=120, proc=None)  # the run goes on
    assert proc.poll() is None and not events(run_dir, "stop")
    _stop(proc, run_dir, signal.SIGTERM, group=False, after_steps=seen + 2)
    _assert_stopped_and_resumable(run_dir)


@pytest.mark.slow
def test_sigterm_with_a_grace_period_too_short_for_the_full_checkpoint_saves_a_light_state(tmp_path: Path) -> None:
    """A scheduler's SIGTERM with a grace period the full checkpoint does not fit in: the stop saves the light
    state (stream position, queue, in-flight prompts; the weights of the last periodic checkpoint) and says so,
    and the resume loses no prompt."""
    run_dir = tmp_path / "run"
    # a periodic checkpoint every 5 versions; the signal after step 6, so the stop is not at a periodic one
    proc = _shell(run_dir, "> /dev/null 2>&1", "checkpoint.every_versions=5", "resources.stop_grace_s=0.05")
    _stop(proc, run_dir, signal.SIGTERM, group=False, after_steps=6)
    stop = events(run_dir, "stop")[0]
    assert stop["grace_s"] == 0.05 and "light stop state" in stop["message"], stop["message"]
    assert stop["weights_step"] is not None and stop["weights_step"] % 5 == 0 and stop["weights_step"] < stop["step"]
    _assert_stopped_and_resumable(run_dir, kind="light")
    assert "a light stop state: no prompt is lost" in events(run_dir, "resume")[-1]["message"]


@pytest.mark.slow
def test_sigterm_then_sigkill_after_the_grace_period_keeps_the_stop_state(tmp_path: Path) -> None:
    """Like Slurm / Kubernetes: SIGTERM, then SIGKILL to everything 2 s later. What the stop saved in the grace
    period is intact (full or light, whichever fit) and the resume is exact."""
    run_dir = tmp_path / "run"
    # `exec`: the launch is this test's child, so the SIGKILLed driver is reaped (a zombie would still hold its
    # entry in the registry of live runs, and the resume would be refused as a second live run)
    proc = _shell(run_dir, "> /dev/null 2>&1", "checkpoint.every_versions=5", env={"ASYNCRL_STOP_GRACE_S": "2"},
                  prefix="exec ")
    wait_for(lambda: len(train_steps(run_dir)) >= 6, timeout=300, proc=None)
    os.kill(_launch_pid(proc.pid), signal.SIGTERM)
    time.sleep(2.0)
    kill_session(proc.pid)
    proc.wait(timeout=30)
    stop = _assert_stopped_and_resumable(run_dir, kind=None)
    assert stop["saved"] in ("full", "light") and stop["grace_s"] == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("redirect", [">&- 2>&-", "> /dev/full 2>&1"], ids=["closed", "full-disk"])
def test_output_closed_or_on_a_full_disk_does_not_stop_the_stop(tmp_path: Path, redirect: str) -> None:
    run_dir = tmp_path / "run"
    proc = _shell(run_dir, redirect)
    _stop(proc, run_dir, signal.SIGTERM, group=False)
    assert "stopped by SIGTERM" in (run_dir / "run.log").read_text()
    _assert_stopped_and_resumable(run_dir)
