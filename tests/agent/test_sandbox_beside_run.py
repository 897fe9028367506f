"""Issue 44's last acceptance clause: "the tiny tool preset run beside them keeps training".

Protocol: a real `asyncrl launch presets/runs/tiny-tools-cpu.toml` (real Ray, the real rollouter calling its
`lookup` tool through the bubblewrap box) starts in a process session of its own. Once it has trained its first
step, this process fires the hostile-tool cases through the same box (`run_sandboxed`), aimed at that run: read,
overwrite and plant files in its run directory, read the Ray token in home, connect to its Ray port, SIGKILL its
driver and the box's parent, a fork bomb, a 10 GB file, an output flood, a `setsid` grandchild that never exits,
invalid UTF-8, the environment — round after round until the run has recorded `BESIDE_STEPS` steps during the
barrage (or has ended, or 10 rounds passed). Each call must answer within its timeout + 2 s with the expected
status. Then the run must exit 0 with every step 1..N recorded, at least `BESIDE_STEPS` step records written to
its metrics.jsonl between the barrage's first call and its last answer (with tool calls of its own among them),
its files untouched by the tools, no process of a call left, and this process's peak RSS grown by < 50 MB.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from engine.agent.box import unavailable_reason
from engine.agent.sandbox import SandboxLimits, ToolOutcome, run_sandboxed

# in `make test` (its integration suite, about 70 s): the acceptance asks for it in CI beside the hostile suite
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no tool box here: {unavailable_reason()}")]

REPO = Path(__file__).resolve().parents[2]
PYTHON = "engine.agent.builtin_tools:python"
STEPS = 40
BESIDE_STEPS = 3
SECRET = "hf_beside_secret_4242"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip() and x.endswith("}")]


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in _records(run_dir) if "critic/rewards/mean" in r]


def _cases(run_dir: Path, ray_port: int, driver: int) -> list[tuple[str, float, tuple[str, ...]]]:
    """(code, timeout_s, the statuses it may answer with) for every hostile case, aimed at the live run."""
    host_ip = socket.gethostbyname(socket.gethostname())
    files = [run_dir / "config.resolved.json", Path.home() / ".ray" / "auth_token", Path("/etc/passwd")]
    bad = ("error", "limit")
    return [
        ("import __main__; __main__._DENY = ()\nimport subprocess\nsubprocess.run(['id'], check=True)", 2, bad),
        *[(f"print(open({str(p)!r}).read())", 2, bad) for p in files],
        (f"open({str(run_dir / 'config.resolved.json')!r}, 'w').write('pwned')", 2, bad),
        (f"open({str(run_dir / 'json.py')!r}, 'w').write('raise SystemExit')", 2, bad),
        *[(f"import socket\nsocket.create_connection(({h!r}, {ray_port}), timeout=1)", 2, bad)
          for h in ("127.0.0.1", host_ip)],
        (f"import os, signal\nos.kill({driver}, signal.SIGKILL)", 2, bad),
        ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n"
         "import time\ntime.sleep(5)", 1, ("ok", "error", "timeout")),
        ("import os\nwhile True:\n    os.fork()", 3, ("limit", "error", "timeout")),
        ("f = open('big', 'wb')\nfor _ in range(10 * 1024):\n    f.write(bytes(1 << 20))", 3, ("limit",)),
        ("import os\nwhile True:\n    os.write(1, b'x' * 65536)", 1, ("timeout",)),
        ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\ntime.sleep(1000)", 1,
         ("timeout",)),
        ("import os\nos.write(1, b'\\xff\\xfe' * 1000)\nprint(sorted(os.environ))", 2, ("ok",)),
    ]


def _fire(code: str, timeout_s: float, allowed: tuple[str, ...]) -> ToolOutcome:
    marker = f"beside-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    out = run_sandboxed(PYTHON, {"code": f"# {marker}\n{code}"}, SandboxLimits(timeout_s=timeout_s))
    took = time.monotonic() - t0
    assert took < timeout_s + 2, (code, out, took)
    assert out.status in allowed, (code, out)
    assert SECRET not in out.text
    out.text.encode("utf-8")
    time.sleep(0.05)
    left = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and marker.encode() in (d / "cmdline").read_bytes():
                left.append(d.name)
        except OSError:
            pass
    assert left == [], f"processes of the call survived it: {code!r}"
    return out


def test_the_tiny_tool_run_keeps_training_through_a_hostile_barrage(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)  # inherited by nothing: the box clears its environment
    run_dir = tmp_path / "run"
    name = f"beside-{uuid.uuid4().hex[:8]}"
    sets = ["trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
            f"rollout.total_rollout_steps={STEPS * 8}", "trainer.test_freq=0", "trainer.val_before_train=false",
            "logging.progress=false", f'logging.run_dir="{run_dir}"', f'name="{name}"']
    args = [sys.executable, "-m", "asyncrl_cli", "launch", str(REPO / "presets" / "runs" / "tiny-tools-cpu.toml")]
    for s in sets:
        args += ["--set", s]
    log = (tmp_path / "launch.log").open("w")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        deadline = time.monotonic() + 240
        while not _steps(run_dir) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _steps(run_dir), f"the run trained no step (exit {proc.poll()}): {(tmp_path / 'launch.log').read_text()[-3000:]}"
        run = json.loads((run_dir / "run.json").read_text())
        ray_port = int(run["address"].rsplit(":", 1)[1])
        config_sha = _sha(run_dir / "config.resolved.json")
        token = Path.home() / ".ray" / "auth_token"
        token_sha = _sha(token) if token.exists() else None
        cases = _cases(run_dir, ray_port, run["pid"])
        before, rounds = len(_steps(run_dir)), 0
        while True:
            for code, timeout_s, allowed in cases:
                _fire(code, timeout_s, allowed)
            rounds += 1
            beside = _steps(run_dir)[before:]  # recorded while the barrage ran
            if len(beside) >= BESIDE_STEPS or proc.poll() is not None or rounds >= 10:
                break
        assert proc.wait(timeout=240) == 0, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    steps = _steps(run_dir)
    assert [r["training/global_step"] for r in steps] == list(range(1, STEPS + 1))
    assert len(beside) >= BESIDE_STEPS, f"{len(beside)} steps recorded during {rounds} barrage round(s)"
    assert sum(r.get("asyncrl/tools/calls", 0) for r in beside) > 0  # the run's own tool calls went on meanwhile
    assert _sha(run_dir / "config.resolved.json") == config_sha and not (run_dir / "json.py").exists()
    assert token_sha is None or _sha(token) == token_sha
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0 < 50
