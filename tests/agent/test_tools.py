"""Tool calls, the registry and the sandbox: a tool that raises, hangs, crashes or returns garbage gives the
model an error text and a counted status — it never raises in the caller."""

from __future__ import annotations

import time

import pytest

from engine.agent.builtin_tools import calculator
from engine.agent.sandbox import SandboxLimits, ToolRunner, run_sandboxed
from engine.agent.tool_calls import ToolCall, ToolCallError, parse_hermes, parser
from engine.agent.tools import ToolRegistry, from_verl_yaml



def test_hermes_parses_calls_in_order_and_reports_malformed_ones():
    text = ('I will compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"7\\"}"}</tool_call>'
            '<tool_call>{not json}</tool_call><tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x"')
    calls = parse_hermes(text)
    assert calls[0] == ToolCall("calculator", {"expression": "2*3"})
    assert calls[1] == ToolCall("calculator", {"expression": "7"})  # doubly-encoded arguments
    assert isinstance(calls[2], ToolCallError) and "not valid JSON" in calls[2].message
    assert isinstance(calls[3], ToolCallError) and "name" in calls[3].message
    assert len(calls) == 4  # the unclosed block is no call
    assert parse_hermes("the answer is 6") == []
    with pytest.raises(ValueError, match="known: bare, hermes"):
        parser("react")


def test_bare_format_calls_the_tool_a_turn_begins_with():
    assert parser("bare")("lookup") == [ToolCall("lookup", {})]
    assert parser("bare")(" lookup 3 1") == [ToolCall("lookup", {})]
    assert parser("bare")("381") == [] and parser("bare")("") == []


def test_calculator_is_exact_and_refuses_code():
    assert calculator("123456789 * 987654321") == "121932631112635269"
    assert calculator("(7 + 5) // 5 - 2**3") == "-6"
    assert calculator("1/4") == "0.25"
    for bad in ("__import__('os')", "x + 1", "2 ** 100000", "1/0"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_registry_checks_arguments_against_the_schema():
    reg = ToolRegistry.builtin(["calculator", "python"])
    assert [s["function"]["name"] for s in reg.openai_schemas()] == ["calculator", "code_interpreter"]
    assert reg.check(ToolCall("calculator", {"expression": "1+1"})) is None
    assert "unknown tool" in reg.check(ToolCall("search", {}))
    assert "missing argument(s) expression" in reg.check(ToolCall("calculator", {}))
    assert "unknown argument(s) x" in reg.check(ToolCall("calculator", {"expression": "1", "x": 2}))
    assert "must be of type string" in reg.check(ToolCall("calculator", {"expression": 12}))


def test_sandbox_runs_a_tool_and_captures_its_output():
    out = run_sandboxed("engine.agent.builtin_tools:python", {"code": "print(sum(range(101)))"}, SandboxLimits())
    assert (out.status, out.text.strip()) == ("ok", "5050")
    out = run_sandboxed("engine.agent.builtin_tools:calculator", {"expression": "6*7"}, SandboxLimits())
    assert (out.status, out.text) == ("ok", "42")


@pytest.mark.parametrize(
    ("code", "status", "text"),
    [
        ("raise RuntimeError('boom')", "error", "RuntimeError: boom"),
        ("import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)", "error", "unreachable"),
        ("import subprocess; subprocess.run(['true'])", "error", "No such file or directory"),
        ("x = bytearray(2 * 1024**3)", "limit", "MemoryError"),
        ("import os; os.kill(os.getpid(), 9)", "error", "signal 9"),
        ("open('big', 'wb').write(bytes(64 << 20))", "limit", "File too large"),
        ("return_value = None\nclass X: pass\nimport builtins\nbuiltins.print(X)", "ok", "X"),
    ],
)
def test_sandbox_turns_every_failure_into_an_outcome(code, status, text):
    """No network (a fresh network namespace), no programs (no /usr/bin), limits that answer by name."""
    out = run_sandboxed("engine.agent.builtin_tools:python", {"code": code}, SandboxLimits(memory_mb=512))
    assert out.status == status, out
    assert text in out.text


def test_python_tool_imports_numpy_and_sympy_in_its_box():
    code = "import numpy, sympy\nprint(int(numpy.arange(5).sum()), sympy.factorint(360))"
    out = run_sandboxed("engine.agent.builtin_tools:python", {"code": code}, SandboxLimits(timeout_s=20))
    assert (out.status, out.text.strip()) == ("ok", "10 {2: 3, 3: 2, 5: 1}"), out


def test_sandbox_kills_a_hanging_tool_at_its_deadline_and_truncates_long_output():
    t0 = time.monotonic()
    out = run_sandboxed("engine.agent.builtin_tools:python", {"code": "import time\nwhile True: time.sleep(1)"},
                        SandboxLimits(timeout_s=1.0))
    assert out.status == "timeout" and time.monotonic() - t0 < 5
    out = run_sandboxed("engine.agent.builtin_tools:python", {"code": "print('x' * 10000)"},
                        SandboxLimits(max_output_chars=100))
    assert out.status == "ok" and out.text.startswith("x" * 100) and "truncated at 100" in out.text


def test_runner_runs_calls_concurrently():
    runner = ToolRunner(max_concurrent=3)
    t0 = time.monotonic()
    futures = [runner.submit("engine.agent.builtin_tools:python", {"code": "import time; time.sleep(1.5)"},
                             SandboxLimits(timeout_s=10)) for _ in range(3)]
    assert all(f.result().ok for f in futures)
    assert time.monotonic() - t0 < 4.0  # three 1.5 s calls in parallel, not 4.5 s in a row
    runner.close()


def test_verl_tool_config_maps_the_code_interpreter_and_refuses_the_rest(tmp_path):
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(
        "tools:\n"
        "  - class_name: recipe.retool.retool.CustomSandboxFusionTool\n"
        "    config: {sandbox_fusion_url: 'http://x/run_code', default_timeout: 30, memory_limit_mb: 1024}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: code_interpreter\n"
        "        description: A tool for executing code.\n"
        "        parameters: {type: object, properties: {code: {type: string}}, required: [code]}\n"
    )
    reg = from_verl_yaml(cfg)
    tool = reg.tools["code_interpreter"]
    assert tool.function == "engine.agent.builtin_tools:python" and tool.limits.timeout_s == 30
    cfg.write_text(cfg.read_text() + "  - class_name: verl.tools.search_tool.SearchTool\n"
                   "    tool_schema: {type: function, function: {name: search}}\n")
    with pytest.raises(ValueError, match=r"search \(verl.tools.search_tool.SearchTool\): no asyncrl equivalent"):
        from_verl_yaml(cfg)


def test_a_bare_call_is_read_when_the_tokenizer_joins_the_next_token_without_a_space() -> None:
    """The tiny tool model's vocabulary has no space: `lookup` then `1` decodes as "lookup1"; still a `lookup` call."""
    from engine.agent.tool_calls import ToolCall, parse_bare

    assert parse_bare("lookup1") == [ToolCall("lookup", {})]
    assert parse_bare(" lookup") == [ToolCall("lookup", {})]
    assert parse_bare("123") == []  # digits first: an answer
