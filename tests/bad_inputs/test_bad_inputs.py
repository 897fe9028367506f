"""The bad-input corpus: every file in `cases/` is a run file a user could write (or a launch they could type)
that must end with its documented exit code and one clear line — never a traceback, never an "internal
error", and never a half-made or altered run directory.

A case's header comments say what it expects:

    # expect-exit: 1                     the exit code of `asyncrl launch` (0/1/2/3)
    # expect-message: unknown key        text of the one line that names the problem
    # args: --set rollout.n              extra launch arguments (`${BAD_INPUTS}` and RUN_DIR expanded)
    # argv-file: no_such_run.toml        launch this path instead of the case file
    # run-dir: run_dirs/corrupt          a run directory from data/ to launch into (copied; must stay as it was)
    # runtime: true                      a real (small) run on local Ray — errors that happen while it runs
    # expect-event: reward               ... must leave an event of this kind
    # expect-counter: asyncrl/reward/errors   ... and this counter > 0 in the last metric record

Data files (parquet, model directories, reward modules, run directories) live in `data/`;
`make_data.py` regenerates the binary ones. The CLI runs in process through its console entry point
(`asyncrl_cli.app.main`), so the last-line error handler is exercised exactly as a user would see it.
"""

from __future__ import annotations

import filecmp
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CASES = sorted((HERE / "cases").glob("*.toml"))
REWARDS = HERE / "data" / "rewards"
SMALL_RUN = ("trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size_per_gpu=8", "rollout.n=2",
             "rollout.total_rollout_steps=8", "trainer.test_freq=0", "trainer.val_before_train=false")
KNOWN_GAPS: dict[str, str] = {}


@dataclass
class Case:
    path: Path
    exit_code: int
    message: str = ""
    args: list[str] = field(default_factory=list)
    argv_file: str | None = None
    run_dir: str | None = None
    runtime: bool = False
    event: str | None = None
    counter: str | None = None


def parse_case(path: Path) -> Case:
    """The `# key: value` header of a case file."""
    head: dict[str, str] = {}
    for raw in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        if not raw.startswith("#"):
            break
        key, sep, value = raw[1:].partition(":")
        if sep:
            head[key.strip()] = value.strip()
    return Case(path, int(head["expect-exit"]), head.get("expect-message", ""), shlex.split(head.get("args", "")),
                head.get("argv-file"), head.get("run-dir"), head.get("runtime") == "true",
                head.get("expect-event"), head.get("expect-counter"))


def _params() -> list:
    out = []
    for p in CASES:
        marks = [pytest.mark.integration] if parse_case(p).runtime else []
        if p.name in KNOWN_GAPS:
            marks.append(pytest.mark.xfail(reason=KNOWN_GAPS[p.name], strict=True))
        out.append(pytest.param(p, id=p.stem, marks=marks))
    return out


def test_the_corpus_is_large_and_covers_every_kind() -> None:
    names = [p.stem for p in CASES]
    assert len(names) >= 30
    for prefix in ("toml_", "type_", "unknown_", "extends_", "env_", "size_", "cli_", "data_", "reward_",
                   "model_", "resume_"):
        assert any(n.startswith(prefix) for n in names), prefix
    assert {parse_case(p).exit_code for p in CASES} >= {0, 1, 2, 3}


def _launch(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`asyncrl ARGV` through the console entry point; returns (exit code, stdout + stderr)."""
    from asyncrl_cli.app import main

    monkeypatch.setattr(sys, "argv", ["asyncrl", *argv])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("case_path", _params())
def test_bad_input_ends_cleanly(case_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    case = parse_case(case_path)
    monkeypatch.setenv("BAD_INPUTS", str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REWARDS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(REWARDS))
    monkeypatch.chdir(case_path.parent)
    run_dir = tmp_path / "run"
    if case.run_dir:
        shutil.copytree(HERE / "data" / case.run_dir, run_dir)
    args = [os.path.expandvars(a).replace("RUN_DIR", str(run_dir)) for a in case.args]
    sets = [f'logging.run_dir="{run_dir}"', "logging.progress=false", *(SMALL_RUN if case.runtime else ())]
    argv = ["launch", case.argv_file or case_path.name, *args]
    for s in sets:
        argv += ["--set", s]

    code, out = _launch(argv, capsys, monkeypatch)

    assert "Traceback" not in out, out
    assert "internal error" not in out, out
    assert code == case.exit_code, out
    if case.message:
        lines = [ln for ln in out.splitlines() if case.message in ln]
        assert len(lines) == 1, out  # one line names the problem
    assert len([ln for ln in out.splitlines() if ln.strip()]) <= 12, out  # a message, not a dump
    if case.runtime:
        _check_runtime(case, run_dir)
    elif case.run_dir:
        _assert_same_tree(HERE / "data" / case.run_dir, run_dir)  # the run directory is left as it was
    else:
        assert not run_dir.exists() or not any(run_dir.iterdir()), sorted(run_dir.iterdir())


def _check_runtime(case: Case, run_dir: Path) -> None:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    assert any(e["kind"] == case.event for e in events), [e["kind"] for e in events]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = [r for r in records if case.counter in r][-1]
    assert last[case.counter] > 0


def _assert_same_tree(a: Path, b: Path) -> None:
    cmp = filecmp.dircmp(a, b)
    assert not cmp.left_only and not cmp.right_only and not cmp.diff_files, (cmp.left_only, cmp.right_only,
                                                                             cmp.diff_files)
    for sub in cmp.common_dirs:
        _assert_same_tree(a / sub, b / sub)
