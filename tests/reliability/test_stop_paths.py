"""The stop path's parts, without Ray: the guarded output (a closed pipe, a full disk, a closed stdout), the
stop signals (SIGHUP left ignored under nohup), the grace period's choice, light stop states, and a checkpoint
writer killed half-way (never taken for a good checkpoint)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.persist.checkpoint import latest_valid, list_checkpoints, read_checkpoint, verify_checkpoint, write_checkpoint
from engine.persist.stop_grace import (
    EXIT_RESERVE_S,
    choose_stop_state,
    full_checkpoint_s,
    stop_deadline,
    stop_grace_s,
)
from engine.runtime.stop_signals import StopSignals
from engine.runtime.terminal import GuardedStream, RunLog

REPO = Path(__file__).resolve().parents[2]


def _child(code: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, stderr=subprocess.PIPE, text=True,
                          timeout=60, **kw)


# ------------------------------------------------------------------------------------------- output
def test_a_closed_pipe_degrades_to_the_run_log(tmp_path: Path) -> None:
    """`| tee` killed by Ctrl-C: the next write gets EPIPE; it and every later one land in run.log."""
    r, w = os.pipe()
    os.close(r)
    log = RunLog()
    log.attach(tmp_path)
    out = GuardedStream(w, "stderr", log)
    try:
        assert out.write("asyncrl: stopping with a checkpoint\n") > 0  # no BrokenPipeError
        print("asyncrl: resume with: asyncrl launch RUN.toml --resume auto", file=out)
    finally:
        os.close(w)
    text = (tmp_path / "run.log").read_text()
    assert "stderr is gone (BrokenPipeError" in text
    assert "stopping with a checkpoint" in text and "--resume auto" in text
    assert log.failed == ["stderr: BrokenPipeError"]


def test_a_full_disk_degrades_to_the_run_log_and_lines_before_the_run_dir_wait(tmp_path: Path) -> None:
    """stdout on a full file system (/dev/full: every write fails with ENOSPC)."""
    fd = os.open("/dev/full", os.O_WRONLY)
    log = RunLog()
    out = GuardedStream(fd, "stdout", log)
    try:
        out.write("before the run directory exists\n")
        log.attach(tmp_path)
        out.write("after\n")
    finally:
        os.close(fd)
    text = (tmp_path / "run.log").read_text()
    assert "OSError" in text and "No space left on device" in text
    assert text.index("before the run directory") < text.index("after")


def test_driver_lines_are_copied_to_the_run_log_while_stderr_works(tmp_path: Path) -> None:
    log = RunLog()
    log.attach(tmp_path)
    log.note("asyncrl: resume from X with: asyncrl launch RUN.toml --resume runs/x")
    assert (tmp_path / "run.log").read_text() == "asyncrl: resume from X with: asyncrl launch RUN.toml --resume runs/x\n"


def test_stdout_closed_at_start_is_reopened_on_devnull_and_logged(tmp_path: Path) -> None:
    """`asyncrl launch ... >&-`: fd 1 is closed; no file opened later may take its number, and output goes to
    run.log."""
    res = _child(f"""
        import os, sys
        from engine.runtime import terminal
        log = terminal.install()
        log.attach({str(tmp_path)!r})
        print("to stdout")
        f = open({str(tmp_path / "other.txt")!r}, "w")
        assert f.fileno() != 1, f.fileno()
        assert os.readlink("/proc/self/fd/1") == "/dev/null"
        terminal.say("asyncrl: a driver line")
    """, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "run.log").read_text()
    assert "to stdout" in text and "asyncrl: a driver line" in text
    assert "asyncrl: a driver line" in res.stderr  # stderr still works: the line is there too


# ------------------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_each_stop_signal_raises_keyboard_interrupt_and_is_recorded(name: str) -> None:
    # a suite started in the background by a shell without job control inherits SIGINT ignored, which
    # StopSignals rightly keeps ignored (nohup): start from a handled signal, as a terminal's launch does
    before = signal.signal(getattr(signal, name), signal.default_int_handler)
    signals = StopSignals()
    undo = signals.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), getattr(signal, name))
            time.sleep(1)
    finally:
        undo()
        signal.signal(getattr(signal, name), before)
    assert signals.first is not None and signals.first[0] == name


def test_sighup_ignored_at_start_stays_ignored_under_nohup() -> None:
    res = _child("""
        import os, signal, time
        from engine.runtime.stop_signals import StopSignals
        s = StopSignals()
        s.install()
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
        print(s.ignored, s.received)
    """, preexec_fn=_nohup)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['SIGHUP'] []"


def _nohup() -> None:
    """What `nohup` leaves a child: SIGHUP ignored, SIGINT as a terminal gives it (whatever the suite inherited)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ------------------------------------------------------------------------------------------- grace
class _Cfg:
    class resources:  # noqa: N801 - the config's attribute path
        stop_grace_s = None


def test_grace_comes_from_the_config_else_the_environment() -> None:
    assert stop_grace_s(_Cfg, {}) is None
    assert stop_grace_s(_Cfg, {"ASYNCRL_STOP_GRACE_S": "25"}) == 25.0
    assert stop_grace_s(_Cfg, {"ASYNCRL_STOP_GRACE_S": "soon"}) is None

    class Set(_Cfg):
        class resources:  # noqa: N801
            stop_grace_s = 2.0

    assert stop_grace_s(Set, {"ASYNCRL_STOP_GRACE_S": "25"}) == 2.0


def test_the_full_checkpoint_is_chosen_only_when_it_fits() -> None:
    assert stop_deadline(100.0, None) is None
    assert stop_deadline(100.0, 30.0) == 130.0 - EXIT_RESERVE_S
    assert choose_stop_state(0.0, None, 1e9) == "full"  # no deadline: always the full checkpoint
    assert choose_stop_state(0.0, 10.0, 5.0) == "full"
    assert choose_stop_state(0.0, 10.0, 8.0) == "light"  # 1.5 × 8 s does not fit in 10 s
    assert choose_stop_state(9.95, 10.0, 0.1) == "light"
    assert choose_stop_state(10.5, 10.0, 0.0) == "light"  # past the deadline: the cheapest state
    assert full_checkpoint_s(0.3, 10**12) == 0.3  # a measured write time wins over the size prior
    assert full_checkpoint_s(None, 270 * 2**20) > 2.0  # SmolLM2-135M's weights: no full checkpoint in 2 s


# ------------------------------------------------------------------------------------------- light states
def _full(root: Path, step: int) -> Path:
    def save(p: Path) -> None:
        p.mkdir()
        (p / "model.safetensors").write_bytes(bytes([step]) * 8192)

    return write_checkpoint(root, step, save_trainer=save, state={"step": step, "version": step}, queued=[],
                            in_flight=[], keep_last=1)


def test_a_light_stop_state_links_the_last_full_checkpoints_trainer_state(tmp_path: Path) -> None:
    full = _full(tmp_path, 2)
    light = write_checkpoint(tmp_path, 5, save_trainer=None, state={"step": 5, "stop_state": "light",
                             "weights_step": 2}, queued=[{"uid": "0:9"}], in_flight=[{"uid": "0:10"}],
                             keep_last=1, weights_from=full)
    assert list_checkpoints(tmp_path) == [light]  # keep_last = 1 pruned the full one: the links keep its bytes
    assert verify_checkpoint(light) is None
    ckpt = read_checkpoint(light)
    assert ckpt["trainer_dir"] == str(light / "trainer")
    assert (light / "trainer" / "model.safetensors").read_bytes() == bytes([2]) * 8192
    assert json.loads((light / "manifest.json").read_text())["weights_from"] == str(full)
    assert ckpt["in_flight"] == [{"uid": "0:10"}]


def test_a_light_stop_state_without_a_full_checkpoint_keeps_the_initial_weights(tmp_path: Path) -> None:
    light = write_checkpoint(tmp_path, 3, save_trainer=None, state={"step": 3}, queued=[], in_flight=[],
                             keep_last=2)
    assert verify_checkpoint(light) is None and read_checkpoint(light)["trainer_dir"] is None
    (light / "manifest.json").write_text(json.dumps({"files": json.loads(
        (light / "manifest.json").read_text())["files"]}))  # a full checkpoint's manifest without trainer/
    assert verify_checkpoint(light) == "the manifest lists no trainer state"


# ------------------------------------------------------------------------------------------- killed writer
def test_a_checkpoint_writer_killed_half_way_is_never_taken_for_a_good_one(tmp_path: Path) -> None:
    """SIGKILL while the trainer state is being written (the scheduler's kill after its grace period): the
    newest good checkpoint is still the previous one, and the next save cleans up the leftovers."""
    good = _full(tmp_path, 1)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from engine.persist.checkpoint import write_checkpoint
        def save(p):
            p.mkdir()
            with open(p / "model.safetensors", "wb") as f:
                for _ in range(10_000):
                    f.write(b"x" * 65536)
                    f.flush()
                    time.sleep(0.01)
        write_checkpoint(Path({str(tmp_path)!r}), 2, save_trainer=save, state={{"step": 2}}, queued=[],
                         in_flight=[], keep_last=3)
    """)], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        part = None
        while time.monotonic() < deadline:
            part = next(tmp_path.glob(".tmp-global_step_2-*/trainer/model.safetensors"), None)
            if part is not None and part.stat().st_size > 1 << 20:
                break
            time.sleep(0.05)
        assert part is not None, "the writer never started"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert list_checkpoints(tmp_path) == [good]
    assert latest_valid(tmp_path) == good and verify_checkpoint(good) is None
    _full(tmp_path, 3)
    assert not list(tmp_path.glob(".tmp-*"))
