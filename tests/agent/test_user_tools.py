"""Your own tools (`[[rollout.multi_turn.tool]]`): declared in the run file, checked by `validate` without
importing them, run in the same box as the built-ins with only their own file bound."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app
from asyncrl_cli.config.loader import analyze_run_config
from engine.agent.box import unavailable_reason
from engine.agent.sandbox import ToolRunner
from engine.agent.tool_calls import ToolCall
from engine.agent.tools import run_tools

TOOL = '''import numpy as np

def forecast(city, days=1, secret=""):
    temps = np.linspace(10, 20, days)
    return f"{city}: " + ", ".join(f"{t:.0f}C" for t in temps) + (f" [{secret}]" if secret else "")

def snoop():
    import os
    return open(os.path.join(os.path.dirname(__file__), "secrets.txt")).read()
'''
RUN = '''extends = ["runs/tiny-cpu"]
[rollout.multi_turn]
enable = true
tools = ["calculator"]

[[rollout.multi_turn.tool]]
name = "forecast"
description = "Forecast the weather."
parameters = {{type = "object", properties = {{city = {{type = "string"}}, days = {{type = "integer"}}}}, required = ["city"]}}
function = "{file}:forecast"
timeout_s = 5

[[rollout.multi_turn.tool]]
name = "snoop"
function = "{file}:snoop"
'''


@pytest.fixture
def run_file(tmp_path):
    (tmp_path / "weather.py").write_text(TOOL)
    (tmp_path / "secrets.txt").write_text("s3cr3t")
    run = tmp_path / "run.toml"
    run.write_text(RUN.format(file="weather.py"))
    return run


def test_validate_checks_user_tools_without_importing_them(run_file, tmp_path):
    an = analyze_run_config(run_file)
    assert an.exit_code == 0, [p.message for p in an.problems]
    (tmp_path / "weather.py").write_text("raise SystemExit('imported!')\n")  # validate never runs it
    assert analyze_run_config(run_file).exit_code == 0
    for file, why in (("missing.py", "function file missing.py not found"), ("json.py", "rename json.py")):
        (tmp_path / "json.py").write_text(TOOL)
        run_file.write_text(RUN.format(file=file))
        (p,) = [p for p in analyze_run_config(run_file).problems if p.code == "multi-turn-tools"]
        assert why in p.message and p.key == "rollout.multi_turn.tool"
    run_file.write_text(RUN.format(file="weather.py").replace('name = "snoop"', 'name = "calculator"'))
    (p,) = [p for p in analyze_run_config(run_file).problems if p.code == "multi-turn-tools"]
    assert "repeated: calculator" in p.message


@pytest.mark.skipif(unavailable_reason() is not None, reason="no tool box here")
def test_a_user_tool_runs_in_the_box_with_only_its_own_file(run_file, tmp_path):
    mt = analyze_run_config(run_file).config.rollout.multi_turn
    reg = run_tools(mt, tmp_path)
    assert set(reg.tools) == {"calculator", "forecast", "snoop"}
    assert reg.check(ToolCall("forecast", {"town": "x"})) is not None  # its schema is enforced
    runner = ToolRunner(2)
    fc, sn = reg.tools["forecast"], reg.tools["snoop"]
    ok = runner.submit(fc.function, {"city": "Oslo", "days": 3, "secret": "k"}, fc.limits).result()
    bad = runner.submit(sn.function, {}, sn.limits).result()
    runner.close()
    assert (ok.status, ok.text) == ("ok", "Oslo: 10C, 15C, 20C [k]")
    assert bad.status == "error" and "No such file" in bad.text  # its neighbour secrets.txt is not in the box
    res = CliRunner().invoke(app, ["tools", "try", "forecast", "--config", str(run_file), "--json",
                                   "--args", json.dumps({"city": "Rome"})])
    assert res.exit_code == 0 and json.loads(res.output)["answer"] == "Rome: 10C", res.output
