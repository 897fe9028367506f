"""`engine.runtime.ray_start`: the Ray a run talks to refuses strangers — the version floor, no local run without
token auth unless `--insecure`, the token file 0600, and an `--address` cluster that must refuse a client
without a token (checked against real `ray start` clusters, with and without auth)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from engine.runtime.ray_start import (
    StartRefused,
    check_ray_version,
    cluster_auth_refusal,
    local_auth_mode,
    secure_token_file,
    snapshot_ray_env,
)


def test_an_old_ray_is_refused_with_the_version_it_needs() -> None:
    with pytest.raises(StartRefused, match=r"Ray 2\.51\.0 is installed; asyncrl needs ray>=2\.60\.0"):
        check_ray_version("2.51.0")
    check_ray_version("2.60.0")
    check_ray_version()  # the installed one


def test_a_local_run_without_auth_needs_insecure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(StartRefused, match="RAY_AUTH_MODE=disabled.*pass --insecure"):
        local_auth_mode(insecure=False)
    assert local_auth_mode(insecure=True) == "disabled"
    monkeypatch.setenv("RAY_AUTH_MODE", "none")
    with pytest.raises(StartRefused, match="not a Ray auth mode"):
        local_auth_mode(insecure=True)
    monkeypatch.delenv("RAY_AUTH_MODE")
    assert local_auth_mode(insecure=False) == "token" and os.environ["RAY_AUTH_MODE"] == "token"


def test_the_token_file_is_made_0600_and_a_loose_one_tightened(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    path = tmp_path / "ray" / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert secure_token_file() == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text()) >= 32
    token = path.read_text()
    path.chmod(0o644)
    secure_token_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == token  # the same token, tightened


def test_launch_refuses_a_local_run_with_auth_disabled(monkeypatch, tmp_path: Path, capsys) -> None:
    """As a user sees it: `RAY_AUTH_MODE=disabled asyncrl launch …` ends in one line, exit 1, before Ray starts."""
    from asyncrl_cli.app import main

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    run_file = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
    monkeypatch.setattr(sys, "argv", ["asyncrl", "launch", str(run_file), "--set",
                                      f'logging.run_dir="{tmp_path / "run"}"', "--set", "logging.progress=false"])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    assert e.value.code == 1, out
    assert "cannot start: RAY_AUTH_MODE=disabled" in out.out + out.err and "Traceback" not in out.out + out.err
    import ray

    assert not ray.is_initialized()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _head(auth: str, temp_dir: str) -> tuple[subprocess.Popen, str]:
    """A real one-node `ray start --head --block` with RAY_AUTH_MODE=`auth`, on loopback, in its own session."""
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": auth, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0"}
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
                             "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                             f"--temp-dir={temp_dir}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"127.0.0.1:{port}"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("ray start did not come up")


@pytest.mark.integration
@pytest.mark.parametrize("auth", ["token", "disabled"])
def test_an_address_cluster_must_refuse_a_client_without_a_token(auth: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    secure_token_file()  # the head needs a token to start in token mode
    temp_dir = tempfile.mkdtemp(prefix="asr", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    proc, address = _head(auth, temp_dir)
    try:
        why = cluster_auth_refusal(address)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the head's whole session: it and the processes it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
    if auth == "token":
        assert why is None
    else:
        assert why is not None and "accepts clients without a token" in why and "--insecure" in why
    assert "cannot check" in (cluster_auth_refusal("ray://127.0.0.1:10001") or "")


@pytest.mark.integration
@pytest.mark.slow  # ~50 s: a real launch, ctl from another process, a graceful stop
def test_ctl_reaches_a_local_run_whose_services_listen_on_loopback_only(tmp_path: Path) -> None:
    """A second process (`asyncrl ctl`) joins a local run at its registry address 127.0.0.1:PORT — which Ray
    would rewrite to the node's network address, where nothing listens."""
    repo = Path(__file__).resolve().parents[2]
    asyncrl = Path(sys.executable).with_name("asyncrl")
    env = {**os.environ, "PYTHONPATH": str(repo), "RAY_USAGE_STATS_ENABLED": "0"}
    run_dir, name = tmp_path / "run", f"ctl-loopback-{os.getpid()}"
    proc = subprocess.Popen([str(asyncrl), "launch", str(repo / "presets" / "runs" / "tiny-cpu.toml"),
                             "--set", f'logging.run_dir="{run_dir}"', "--set", f'name="{name}"', "--set",
                             "logging.progress=false", "--set", "trainer.total_steps=100000"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, "the launch ended early"
            time.sleep(0.5)
        t0 = time.monotonic()
        ctl = subprocess.run([str(asyncrl), "ctl", name, "pause"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert ctl.returncode == 0 and "pause" in ctl.stdout, ctl.stdout + ctl.stderr
        assert time.monotonic() - t0 < 30
        stop = subprocess.run([str(asyncrl), "ctl", name, "stop", "--yes"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_run_in_process_leaves_the_environment_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a local start sets (token auth, the loopback switch) is the run's only: a later `ray start` from
    the same process (a test, a notebook) must not inherit it."""
    from engine.control.local_ray import bind_loopback

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")
    restore = snapshot_ray_env()
    assert local_auth_mode(insecure=False) == "token"
    bind_loopback()
    assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    restore()
    assert "RAY_AUTH_MODE" not in os.environ
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
