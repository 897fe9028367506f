"""Helpers for the reliability tests: the tiny preset with overrides, run-directory readers, the expected
prompt order, and launching / killing `asyncrl launch` as a separate process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from asyncrl_cli.config import load_run_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "presets" / "runs" / "tiny-cpu.toml"
ASYNCRL = Path(sys.executable).parent / "asyncrl"
SMALL = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
         "trainer.test_freq=0", "logging.progress=false")


def overrides(run_dir: Path, *extra: str) -> list[str]:
    return [f'logging.run_dir="{run_dir}"', *SMALL, *extra]


def tiny_config(run_dir: Path, *extra: str) -> Any:
    res = load_run_config(TINY, overrides(run_dir, *extra))
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def read_jsonl(path: Path) -> list[dict]:
    """The complete records of a JSONL file a live run may be appending to: a last line without its newline is
    still being written and is left for the next read."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def train_steps(run_dir: Path) -> list[tuple[int, int]]:
    """(step, version) of every training record in metrics.jsonl, in file order."""
    return [(r["training/global_step"], r["fully_async/count/current_param_version"])
            for r in read_jsonl(run_dir / "metrics.jsonl") if "critic/rewards/mean" in r]


def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if kind is None or e["kind"] == kind]


def stream_uids(cfg: Any, count: int) -> list[str]:
    """The first `count` prompt uids the run's prompt stream emits (its order is a pure function of the
    config), computed independently of the run."""
    from engine.data.prompts import load_prompts
    from engine.models.loader import load_tokenizer, resolve_model_path
    from engine.loop.stream import PromptStream, prompts_of

    tok = load_tokenizer(resolve_model_path(cfg.model.path, seed=cfg.trainer.seed))
    stream = PromptStream(cfg.trainer.total_epochs, count)
    return [p.uid for p in prompts_of(stream, lambda e: load_prompts(cfg.data, tok, split="train", epoch=e)[0])]


def assert_ledger_exact(cfg: Any, run_dir: Path, trained: int) -> list[dict]:
    """Every admitted prompt appears once (trained, dropped with a reason, or in flight at the end), the
    admitted prompts are exactly a prefix of the stream (none lost), and `trained` were trained."""
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    uids = [e["uid"] for e in ledger]
    assert len(uids) == len(set(uids)), "a prompt appears twice in the ledger"
    assert set(uids) == set(stream_uids(cfg, len(uids))), "the ledger is not a prefix of the prompt stream"
    assert sum(e["status"] == "trained" for e in ledger) == trained
    assert all(e["status"] in ("trained", "dropped", "in_flight_at_end") for e in ledger)
    assert all(e.get("reason") for e in ledger if e["status"] == "dropped")
    return ledger


def launch(run_dir: Path, *extra: str, resume: str | None = None) -> subprocess.Popen:
    """`asyncrl launch` of the tiny preset as its own process session (so everything it starts can be found)."""
    args = [str(ASYNCRL), "launch", str(TINY)]
    for s in overrides(run_dir, *extra):
        args += ["--set", s]
    if resume:
        args += ["--resume", resume]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (the launch and every Ray process it started)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state, ppid, pgrp, session, ...
            out.append(int(stat.parent.name))
    return out


def kill_session(sid: int, timeout: float = 30.0) -> None:
    """SIGKILL every process of the session and wait until none is left."""
    deadline = time.monotonic() + timeout
    while (pids := session_pids(sid)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    assert not session_pids(sid), f"processes of the killed launch survive: {session_pids(sid)}"


def wait_for(predicate: Any, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launch exited early ({proc.returncode}): {proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)
