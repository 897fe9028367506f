"""`asyncrl bench` is a thin front for `python -m benchmarks` (registered in asyncrl_cli/app.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from asyncrl_cli.commands import bench


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("bench")(bench.command)
    return app


def test_bench_list_names_every_study() -> None:
    from benchmarks import STUDIES

    res = CliRunner().invoke(_app(), ["list"])
    assert res.exit_code == 0, res.output
    assert all(name in res.output for name in STUDIES)


def test_bench_runs_a_study_and_report_ignores_toy_results(tmp_path: Path) -> None:
    res = CliRunner().invoke(_app(), ["cli-latency", "--toy", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "cli-latency.json").read_text())
    assert data["size"] == "toy" and data["command"] == "python -m benchmarks cli-latency --toy"
    docs = tmp_path / "benchmarks.md"
    from benchmarks.cli import main

    assert main(["report", "--out", str(tmp_path), "--docs", str(docs)]) == 0
    assert "No full-size results yet" in docs.read_text()


def test_bench_unknown_study_is_a_usage_error() -> None:
    res = CliRunner().invoke(_app(), ["no-such-study"])
    assert res.exit_code == 2


def test_bench_without_a_source_checkout_fails_in_one_line(monkeypatch, tmp_path: Path) -> None:
    """An installed wheel has no benchmarks/ package: one clear line and exit 1, no traceback."""
    import sys

    monkeypatch.setattr(bench, "_REPO", tmp_path)  # no benchmarks/ beside the installed package
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "benchmarks", None)  # not importable from anywhere
    res = CliRunner().invoke(_app(), ["list"])
    assert res.exit_code == 1
    assert "needs the benchmarks/ folder of a source checkout" in res.output
    assert "Traceback" not in res.output
