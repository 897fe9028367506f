"""`asyncrl tools try`: one call through the run's real sandbox, as a user debugs a tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.agent.box import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason="no tool box here")
ROOT = Path(__file__).resolve().parents[2]
TOOLS_RUN = "presets/runs/tiny-tools-cpu.toml"


def test_the_interpreter_runs_a_file_in_its_box_and_reports_status_time_and_limits(cli, tmp_path):
    code = tmp_path / "x.py"
    code.write_text("print('reading')\nopen('/etc/passwd')\n")
    res = cli("tools", "try", "python", "--code", code, "--json")
    assert res.exit_code == 1, res.output  # the call ended in an error: no /etc in the box
    doc = json.loads(res.output)
    assert doc["status"] == "error" and "FileNotFoundError" in doc["answer"] and doc["sandbox"] == "bubblewrap"
    code.write_text("import numpy, sympy\nprint(int(numpy.ones(3).sum()), sympy.isprime(97))\n")
    res = cli("tools", "try", "code_interpreter", "--code", code)
    assert res.exit_code == 0 and "3 True" in res.output and "ok in" in res.output and "bubblewrap" in res.output


def test_limits_hit_are_named_and_exit_1(cli):
    res = cli("tools", "try", "python", "--args", json.dumps({"code": "while True: pass"}), "--timeout", "1")
    assert res.exit_code == 1 and "timeout" in res.output and "limit hit: time" in res.output
    res = cli("tools", "try", "python", "--args", json.dumps({"code": "x = bytearray(8 << 30)"}), "--json")
    assert res.exit_code == 1 and json.loads(res.output)["limit"] == "memory"


def test_the_run_files_tools_and_usage_errors(cli):
    run = str(ROOT / TOOLS_RUN)
    res = cli("tools", "try", "lookup", "--config", run, "--create-kwargs", '{"secret": "417"}')
    assert res.exit_code == 0 and "417" in res.output
    res = cli("tools", "try", "python", "--config", run, "--args", '{"code": "1"}')
    assert res.exit_code == 2 and "no tool 'python' here" in res.output and "lookup" in res.output
    assert cli("tools", "try", "calculator", "--args", "{not json").exit_code == 2
    res = cli("tools", "try", "calculator", "--args", '{"expr": "1"}')
    assert res.exit_code == 2 and "missing argument(s) expression" in res.output
