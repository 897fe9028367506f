"""Hostile tools against the real bubblewrap box: every case must come back within its timeout + 2 s as an
answer (an error or a hit limit where the code tried something the box forbids), with the run directory and
home unchanged, the parent's peak RSS grown by < 50 MB, no process of the call left behind, no secret in the
answer — and the parent alive to check all that."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from engine.agent.box import unavailable_reason
from engine.agent.sandbox import SandboxLimits, ToolOutcome, run_sandboxed

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no tool box here: {unavailable_reason()}")

PYTHON = "engine.agent.builtin_tools:python"
SECRETS = {"HF_TOKEN": "hf_secret_4242", "WANDB_API_KEY": "wandb_secret_4242", "RAY_AUTH_MODE": "token",
           "RAY_ADDRESS": "127.0.0.1:6379", "AWS_SECRET_ACCESS_KEY": "aws_secret_4242"}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _leftovers(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A run directory (the parent's cwd) with a checkpoint, a home with a file, secrets in the environment."""
    run_dir, home = tmp_path / "run", tmp_path / "home"
    (run_dir / "checkpoints" / "global_step_1").mkdir(parents=True)
    (run_dir / "checkpoints" / "global_step_1" / "model.safetensors").write_bytes(b"weights" * 100)
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("ray_secret_4242")
    monkeypatch.chdir(run_dir)
    monkeypatch.setenv("HOME", str(home))
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    before = (_tree(run_dir), _tree(home), _peak_rss_mb())

    def call(code: str, timeout_s: float = 2.0, **limits) -> ToolOutcome:
        marker = f"hostile-{uuid.uuid4().hex}"
        code = f"# {marker}\n" + code.format(run=run_dir, home=home, marker=marker)
        t0 = time.monotonic()
        out = run_sandboxed(PYTHON, {"code": code}, SandboxLimits(timeout_s=timeout_s, **limits))
        assert time.monotonic() - t0 < timeout_s + 2, out
        assert out.seconds < timeout_s + 2
        out.text.encode("utf-8")  # always valid text for the tokenizer
        time.sleep(0.05)
        assert _leftovers(marker) == [], f"processes of the call survived it: {out}"
        return out

    yield call, run_dir, home
    assert _tree(run_dir) == before[0], "the run directory changed"
    assert _tree(home) == before[1], "home changed"
    assert _peak_rss_mb() - before[2] < 50, "the parent's RSS grew by >= 50 MB"
    assert os.getpid() > 0 and Path(f"/proc/{os.getpid()}").exists()


def _bad(out: ToolOutcome, *statuses: str) -> None:
    assert out.status in (statuses or ("error", "limit")), out


def test_audit_hook_bypass_then_a_program(world):
    call, _, _ = world
    out = call("import __main__; __main__._DENY = ()\nimport subprocess\nsubprocess.run(['id'], check=True)")
    _bad(out)
    assert "No such file" in out.text  # no programs in the box at all


def test_host_files_are_not_there(world):
    call, run_dir, home = world
    for path in ("/etc/passwd", "/etc/shadow", f"{run_dir}/checkpoints/global_step_1/model.safetensors",
                 f"{home}/.ray/auth_token", "/root/.bashrc"):
        out = call(f"print(open({path!r}).read())")
        _bad(out)
        assert "No such file" in out.text or "Permission denied" in out.text, out
    out = call("import os\nprint(' '.join(os.listdir('/')))")
    assert out.ok and set(out.text.split()) <= {"box", "dev", "lib", "lib32", "lib64", "proc", "root", "tmp", "usr"}


def test_writes_into_the_run_directory_and_home_fail(world):
    call, run_dir, home = world
    ckpt = run_dir / "checkpoints" / "global_step_1" / "model.safetensors"
    _bad(call(f"open({str(ckpt)!r}, 'wb').write(b'pwned')"))
    _bad(call(f"open({str(home / '.bashrc')!r}, 'w').write('pwned')"))
    _bad(call("import os\nos.makedirs('/usr/lib/pwned')"))


def test_a_module_planted_in_the_working_directory_is_never_imported(world):
    call, run_dir, _ = world
    planted = "open('json.py', 'w').write('raise SystemExit(\"planted\")')\nopen('sitecustomize.py', 'w').write('x')\n"
    assert call(planted).ok
    out = call("import json\nprint(json.dumps([1]))")
    assert (out.status, out.text.strip()) == ("ok", "[1]")
    out = call(planted + "import sys\nsys.modules.pop('json', None)\nimport json\nprint(json.__file__)")
    assert out.ok and "/tmp" not in out.text, out
    assert not (run_dir / "json.py").exists()


def test_invalid_utf8_on_every_stream(world):
    call, _, _ = world
    out = call("import os\nos.write(1, b'\\xff\\xfe\\x80' * 1000)\nos.write(2, b'\\xc3\\x28')\nprint('\\udcff ok')")
    assert out.ok and "ok" in out.text
    _bad(call("raise ValueError('\\udcff\\ud800')"))


def test_killing_or_signalling_the_parent(world):
    call, _, _ = world
    parent = os.getpid()
    out = call("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\nprint('x')")
    assert out.status in ("ok", "error")  # bwrap's pid 1 ignores it or refuses it; either way an answer
    _bad(call(f"import os, signal\nos.kill({parent}, signal.SIGTERM)"))
    _bad(call(f"import os, signal\nos.kill({parent}, signal.SIGKILL)"))
    out = call("import os, signal\nos.kill(-1, signal.SIGKILL)\nimport time\ntime.sleep(5)", 1.0)
    _bad(out, "error", "timeout")


def test_a_setsid_grandchild_dies_with_the_call(world):
    call, _, _ = world
    forever = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
               "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1000)  # {marker}'])\n")
    out = call(forever + "print('returned')")  # the call ends, its grandchild with it (checked by `call`)
    assert out.ok and "returned" in out.text
    _bad(call(forever + "time.sleep(1000)", 1.0), "timeout")


def test_output_floods_are_capped(world):
    call, _, _ = world
    _bad(call("import os\nwhile True:\n    os.write(1, b'x' * 65536)\n    os.write(2, b'y' * 65536)", 1.0), "timeout")
    _bad(call("while True:\n    print('z' * 100000)", 1.0), "timeout")
    out = call("print('w' * 10**7)", max_output_chars=100)
    assert out.ok and len(out.text) < 200 and "truncated at 100" in out.text
    out = call("print('\\U0001F600' * 5000)")  # 4-byte characters: the cap counts characters, not bytes
    assert out.ok and out.text.startswith("\U0001F600" * 4096) and "truncated at 4096" in out.text


def test_the_environment_has_no_secrets(world):
    call, _, _ = world
    out = call("import os\nprint(dict(os.environ))\nfor p in ('/proc/1/environ', '/proc/self/environ'):\n"
               "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print(e)")
    assert out.ok
    for key, value in SECRETS.items():
        assert key not in out.text and value not in out.text


def test_no_host_port_is_reachable(world):
    call, _, _ = world
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    ray_like = socket.socket()
    ray_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ray_like.bind(("0.0.0.0", 0))
    ray_like.listen()
    ray_like.settimeout(0.2)
    host_ip = socket.gethostbyname(socket.gethostname())
    for target in (("127.0.0.1", port), (host_ip, ray_like.getsockname()[1]), ("127.0.0.1", 6379)):
        out = call(f"import socket\nsocket.create_connection({target!r}, timeout=1)")
        _bad(out)
        assert "refused" in out.text.lower() or "unreachable" in out.text.lower(), out
    for sock in (listener, ray_like):
        with pytest.raises(TimeoutError):
            sock.accept()
        sock.close()


def test_fork_bomb_hits_the_process_limit(world):
    call, _, _ = world
    out = call("import os\nwhile True:\n    os.fork()", timeout_s=3)
    _bad(out, "limit", "error", "timeout")
    assert out.status != "timeout" or out.seconds < 5


def test_a_10_gb_file_hits_the_file_size_limit(world):
    call, _, _ = world
    out = call("f = open('big', 'wb')\nfor _ in range(10 * 1024):\n    f.write(bytes(1 << 20))")
    assert (out.status, out.limit) == ("limit", "file_size"), out
    out = call("import os\nfor k in range(100):\n    open(f'f{{k}}', 'wb').write(bytes(15 << 20))")
    _bad(out)  # the scratch tmpfs is full long before 1.5 GB


def test_memory_and_open_files_limits(world):
    call, _, _ = world
    assert call("x = bytearray(8 << 30)").limit == "memory"
    assert call("fs = [open('/dev/null') for _ in range(100000)]").limit == "open_files"


def test_the_box_as_a_non_root_user(nobody):
    """The same box built by an unprivileged user (uid 65534): here, with unprivileged user namespaces on, it
    isolates; where they are off it refuses with the reason. Uses the system python3 of the venv's minor
    version (this venv's interpreter may sit under a 0700 /root)."""
    system, site, repo = nobody
    script = ("import json, time\nfrom engine.agent.box import unavailable_reason\n"
              "from engine.agent.sandbox import SandboxLimits, run_sandboxed\n"
              "r = unavailable_reason()\nout = {'reason': r}\n"
              "if r is None:\n"
              "    for k, code in {'passwd': 'open(\"/etc/passwd\")', 'bomb': 'import os\\nwhile True: os.fork()',\n"
              "                    'numpy': 'import numpy, sympy; print(numpy.arange(4).sum())',\n"
              "                    'hang': 'import os, time\\nif os.fork() == 0:\\n    os.setsid()\\ntime.sleep(99)',\n"
              "                    'big': 'open(\"b\", \"wb\").write(bytes(64 << 20))'}.items():\n"
              "        t = time.monotonic()\n"
              "        o = run_sandboxed('engine.agent.builtin_tools:python', {'code': code}, SandboxLimits(timeout_s=2))\n"
              "        out[k] = [o.status, o.limit, o.text[:80], time.monotonic() - t]\n"
              "print(json.dumps(out))\n")
    proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "env", "-i",
                           f"PYTHONPATH={repo}:{site}", str(system), "-c", script],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if res["reason"] is not None:  # refuses, and says why and how to fix it
        assert "allow_unsandboxed" in res["reason"] and "bubblewrap" in res["reason"]
        return
    assert res["passwd"][0] == "error" and res["bomb"][0] == "limit" and res["big"][1] == "file_size"
    assert res["numpy"][:1] == ["ok"] and res["numpy"][2].strip() == "6"
    assert res["hang"][0] == "timeout" and res["hang"][3] < 4


@pytest.mark.skipif(__import__("engine.agent.seccomp", fromlist=["program"]).program() is None,
                    reason="no seccomp filter for this architecture")
def test_the_seccomp_filter_denies_namespaces_io_uring_and_keyrings_but_not_threads_or_fork(world):
    call, _, _ = world
    code = ("import ctypes, errno, os, threading\nlibc = ctypes.CDLL(None, use_errno=True)\nres = []\n"
            "for nr, args in ((272, (0x10000000,)), (272, (0x40000000,)), (425, (8, ctypes.create_string_buffer(120))),"
            " (250, (0, -3, 0))):\n"
            "    res.append((libc.syscall(nr, *args), errno.errorcode.get(ctypes.get_errno())))\n"
            "t = threading.Thread(target=res.append, args=('thread',))\nt.start()\nt.join()\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nres.append(os.waitpid(pid, 0)[1] >> 8)\nprint(res)")
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers in this test are x86-64's")
    out = call(code)
    assert out.ok, out
    assert out.text.strip() == str([(-1, "EPERM")] * 4 + ["thread", 7])
