"""verl's tool YAML with a `class_name` of the user's: an unmodified verl-style tool file, checked without being
imported, run statefully per trajectory in its own bubblewrap box — state kept across one trajectory's calls,
separate between trajectories, the box gone at release, and hostile classes unable to hurt the caller."""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from pathlib import Path

import pytest

from engine.agent.box import unavailable_reason
from engine.agent.sandbox import ToolRunner
from engine.agent.tools import from_verl_yaml
from engine.agent.verl_tools import verl_class_tool

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl_tools"
boxed = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no tool box here: {unavailable_reason()}")


def _entry(cls: str, name: str = "t", **config) -> dict:
    return {"class_name": cls, "config": config, "tool_schema": {"type": "function", "function": {
        "name": name, "description": "d", "parameters": {"type": "object", "properties": {}}}}}


def _boxes() -> list[int]:
    """The tool boxes (bwrap and everything in them) under this process: pids from /proc's parent links."""
    parent, cmd = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd[int(d.name)] = (d / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                pass
    mine, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in mine} - mine
        mine |= more
        grew = bool(more)
    return sorted(pid for pid in mine if b"runner.py" in cmd.get(pid, b""))


def _wait_no_boxes(timeout: float = 5.0) -> list[int]:
    end = time.monotonic() + timeout
    while _boxes() and time.monotonic() < end:
        time.sleep(0.05)
    return _boxes()


def test_the_yaml_is_checked_without_importing_the_users_module(tmp_path):
    shutil.copy(FIXTURES / "tools.yaml", tmp_path / "tools.yaml")
    (tmp_path / "notepad_tool.py").write_text("raise SystemExit('imported!')\nclass NotepadTool:\n    pass\n")
    tool = from_verl_yaml(tmp_path / "tools.yaml").tools["notepad"]  # found beside the YAML, parsed, not run
    assert tool.stateful and tool.function == f"{tmp_path / 'notepad_tool.py'}:NotepadTool"
    assert tool.limits.timeout_s == 5 and tool.config == {"greeting": "Notes", "default_timeout": 5}
    assert tool.parameters["required"] == ["note"]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("class Other:\n    pass\n")
    for entry, why in (
            (_entry("pkg.missing.Tool"), "no file pkg/missing.py"),
            (_entry("pkg.mod.Tool"), "defines no class Tool"),
            (_entry("verl.tools.search_tool.SearchTool"), "no asyncrl equivalent"),
            ({**_entry("pkg.mod.Other"), "tool_schema": {"type": "function"}}, "tool_schema.function.name"),
            (_entry("pkg.mod.Other", default_timeout=-1), "must be positive")):
        with pytest.raises(ValueError, match=why):
            verl_class_tool(entry, [tmp_path])
    assert verl_class_tool(_entry("pkg.mod.Other"), [tmp_path]).function.endswith("pkg/mod.py:Other")


@boxed
def test_state_is_per_trajectory_survives_its_calls_and_ends_with_its_box():
    tool = from_verl_yaml(FIXTURES / "tools.yaml").tools["notepad"]
    runner = ToolRunner(4)
    a, b = ("p0", 0, False), ("p0", 1, False)
    try:
        call = lambda key, note, owner: runner.submit_stateful(key, tool, {"note": note}, {
            "create_kwargs": {"owner": owner}}).result()
        first = call(a, "x", "alice")
        assert (first.status, first.text, first.reward) == ("ok", "Notes of alice (call 1): x", 0.1)
        assert call(b, "y", "bob").text == "Notes of bob (call 1): y"
        third = call(a, "z", "ignored: create ran once")
        assert third.text == "Notes of alice (call 2): x, z" and third.seconds < 1.0  # no new box, no new create
        assert runner.sessions.alive() == 2 and len(_boxes()) >= 2
        runner.release([a])
        end = time.monotonic() + 3
        while runner.sessions.alive() > 1 and time.monotonic() < end:
            time.sleep(0.05)
        assert runner.sessions.alive() == 1
        assert call(b, "w", "bob").text == "Notes of bob (call 2): y, w"  # the other trajectory is untouched
        signed = runner.submit_stateful(b, tool, {"note": "v"}, {"execute_kwargs": {"sign": "B."}}).result()
        assert signed.text == "Notes of bob (call 3): y, w, v — B."  # the row's execute_kwargs reach execute
    finally:
        runner.close()
    assert _wait_no_boxes() == []


@boxed
def test_a_verl_0_5_style_tool_runs_and_create_kwargs_reach_it_both_ways(tmp_path):
    tool = verl_class_tool(_entry("notepad_tool.OldStyleTool"), [FIXTURES])
    runner = ToolRunner(1)
    try:
        out = runner.submit_stateful(("u", 0, True), tool, {}, {"create_kwargs": {"ground_truth": "4"}}).result()
    finally:
        runner.close()
    assert (out.status, out.text) == ("ok", "old style sees ['ground_truth']")


@boxed
def test_a_dead_box_answers_an_error_and_the_next_call_starts_fresh():
    tool = verl_class_tool(_entry("hostile_tool.Crashes"), [FIXTURES])
    runner = ToolRunner(1)
    key = ("p", 0, False)
    try:
        assert runner.submit_stateful(key, tool, {}, {}).result().text == "call 1"
        dead = runner.submit_stateful(key, tool, {"crash": True}, {}).result()
        assert dead.status == "error" and "state is lost" in dead.text
        fresh = runner.submit_stateful(key, tool, {}, {}).result()
        assert fresh.ok and fresh.text.endswith("call 1") and "fresh one" in fresh.text
        picky = verl_class_tool(_entry("hostile_tool.FailsCreateOnce"), [FIXTURES])
        failed = runner.submit_stateful(("q", 0, False), picky, {}, {}).result()
        assert failed.status == "error" and "create: ValueError: no key" in failed.text
        assert runner.submit_stateful(("q", 0, False), picky, {}, {"create_kwargs": {"key": "k"}}).result().text.endswith("key k")
    finally:
        runner.close()
    assert _wait_no_boxes() == []


@boxed
@pytest.mark.parametrize("cls, args, status", [
    ("HangsInCreate", {}, "timeout"),
    ("KillsParent", {}, None),
    ("Floods", {}, "ok"),  # 50 MB returned: cut in the box to max_output_chars
    ("Floods", {"where": "answer"}, "limit"),  # the answer pipe flooded: the byte cap ends the box
    ("Floods", {"where": "stdout"}, "timeout"),  # stdout drained and dropped until the deadline
])
def test_hostile_classes_answer_within_the_deadline_and_leave_nothing(cls, args, status):
    tool = verl_class_tool(_entry(f"hostile_tool.{cls}", default_timeout=2, memory_limit_mb=512), [FIXTURES])
    runner = ToolRunner(1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        t0 = time.monotonic()
        out = runner.submit_stateful(("p", 0, False), tool, args, {}).result(timeout=10)
        took = time.monotonic() - t0
        runner.release([("p", 0, False)])
    finally:
        runner.close()
    assert took < 2 + 2, took
    assert os.getppid() > 0  # this process (the rollouter's stand-in) is alive and answers
    if status is not None:
        assert out.status == status, out
        assert len(out.text) < 4096 + 200
    else:  # its signals reach nothing outside its pid namespace; the box ends when it kills itself
        assert out.ok or out.status == "error"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss < 50
    assert _wait_no_boxes() == []


@boxed
def test_a_box_never_outlives_its_trajectory():
    """A class that forks a `setsid` daemon and never returns from `release`: release still ends the whole box
    within its 1 s; one never released dies at the trajectory deadline, and later calls are refused."""
    tool = verl_class_tool(_entry("hostile_tool.NeverReleases", trajectory_timeout_s=3), [FIXTURES])
    runner = ToolRunner(2)
    try:
        assert runner.submit_stateful(("a", 0, False), tool, {}, {}).result().text == "forked a daemon"
        assert runner.submit_stateful(("b", 0, False), tool, {}, {}).result().text == "forked a daemon"
        assert len(_boxes()) >= 4  # two boxes, each with its daemon
        t0 = time.monotonic()
        runner.sessions.release([("a", 0, False)]).result(timeout=5)
        assert time.monotonic() - t0 < 2.5
        assert runner.sessions.alive() == 1
        time.sleep(3.2)  # b's trajectory deadline (3 s from its box's start) passes
        assert _wait_no_boxes(3.0) == []
        late = runner.submit_stateful(("b", 0, False), tool, {}, {}).result()
        assert late.status == "error" and "deadline" in late.text
    finally:
        runner.close()


RUN = '''extends = ["runs/tiny-cpu"]
[rollout.multi_turn]
enable = true
tool_config_path = "tools.yaml"
'''


def test_validate_and_tools_try_take_a_verl_class_tool(tmp_path):
    """`validate` checks the YAML (file, class, schema) without importing the module; `tools try` runs one
    create → execute → release in the run's box, the row's create_kwargs given to `create`."""
    from typer.testing import CliRunner

    from asyncrl_cli.app import app
    from asyncrl_cli.config.loader import analyze_run_config

    shutil.copy(FIXTURES / "tools.yaml", tmp_path / "tools.yaml")
    (tmp_path / "notepad_tool.py").write_text((FIXTURES / "notepad_tool.py").read_text()
                                              + "\nraise SystemExit('imported at validate!')\n")
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    an = analyze_run_config(run)
    assert an.exit_code == 0, [p.message for p in an.problems]
    (tmp_path / "tools.yaml").write_text((FIXTURES / "tools.yaml").read_text().replace("NotepadTool", "Nope"))
    (p,) = [p for p in analyze_run_config(run).problems if p.code == "multi-turn-tools"]
    assert "defines no class Nope" in p.message and p.key == "rollout.multi_turn.tool_config_path"
    if unavailable_reason() is not None:
        return
    shutil.copy(FIXTURES / "tools.yaml", tmp_path / "tools.yaml")
    shutil.copy(FIXTURES / "notepad_tool.py", tmp_path / "notepad_tool.py")
    res = CliRunner().invoke(app, ["tools", "try", "notepad", "--config", str(run), "--json", "--args",
                                   '{"note": "hi"}', "--create-kwargs", '{"owner": "ann"}'])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert (doc["answer"], doc["status"], doc["reward"]) == ("Notes of ann (call 1): hi", "ok", 0.1)
    assert _wait_no_boxes() == []


@boxed
def test_the_rollouters_tool_shell_runs_a_class_per_trajectory_and_releases_it(tmp_path):
    """Through the rollouter's `ToolShell`: a row's `tools_kwargs.notepad.create_kwargs` reach `create`, each
    trajectory has its own instance, and the core's `ReleaseTools` ends its box."""
    from asyncrl_cli.config import load_run_config
    from engine.loop.commands import CallTools, ReleaseTools
    from engine.models.loader import load_tokenizer, resolve_model_path
    from engine.runtime.tool_shell import ToolShell
    from engine.agent.template import tool_answer_ids
    from engine.agent.tool_calls import ToolCall

    preset = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-tools-cpu.toml"
    cfg = load_run_config(preset, [f'logging.run_dir="{tmp_path}"', "rollout.multi_turn.tools=[]",
                                   f'rollout.multi_turn.tool_config_path="{FIXTURES / "tools.yaml"}"']).config
    tok = load_tokenizer(resolve_model_path(cfg.model.path))
    shell = ToolShell(cfg.rollout.multi_turn, tok)
    kwargs = lambda owner: {"notepad": {"create_kwargs": {"owner": owner}}}

    def answers(n: int) -> dict:
        got: dict = {}
        end = time.monotonic() + 30
        while len(got) < n and time.monotonic() < end:
            got.update({(u, i): tok.decode(ids) for u, i, ids, _ in shell.ready()})
            time.sleep(0.02)
        return got

    try:
        # the tiny tokenizer keeps digits (and drops most letters): owners and notes are numbers
        expect = lambda text: tok.decode(tool_answer_ids(tok, [text]))
        shell.start(CallTools("p", 0, (ToolCall("notepad", {"note": "7"}),), (), kwargs("381")))
        shell.start(CallTools("p", 1, (ToolCall("notepad", {"note": "8"}),), (), kwargs("907")))
        first = answers(2)
        assert first == {("p", 0): expect("Notes of 381 (call 1): 7"), ("p", 1): expect("Notes of 907 (call 1): 8")}
        shell.start(CallTools("p", 0, (ToolCall("notepad", {"note": "5"}),), (), kwargs("381")))
        assert answers(1) == {("p", 0): expect("Notes of 381 (call 2): 7, 5")}
        assert shell.counters()["asyncrl/tools/instances"] == 2
        shell.release(ReleaseTools((("p", 0, False),)))
        end = time.monotonic() + 5
        while shell.runner.sessions.alive() > 1 and time.monotonic() < end:
            time.sleep(0.05)
        assert shell.runner.sessions.alive() == 1
    finally:
        shell.close()  # the rollouter stops: the other trajectory's box goes too
    assert _wait_no_boxes() == []


def test_a_class_tool_as_a_non_root_user(nobody):
    """As uid 65534 (unprivileged bwrap in a user namespace): state across calls, a hang cut at its deadline,
    release — or, where user namespaces are off, the refusal with its reason."""
    import subprocess

    system, site, repo = nobody
    script = f'''import json, time
from pathlib import Path
from engine.agent.box import unavailable_reason
from engine.agent.sandbox import ToolRunner
from engine.agent.verl_tools import verl_class_tool
out = {{"reason": unavailable_reason()}}
if out["reason"] is None:
    e = lambda c: {{"class_name": c, "config": {{"default_timeout": 2}}, "tool_schema": {{"function": {{"name": "t"}}}}}}
    runner, F = ToolRunner(2), [Path({str(FIXTURES)!r})]
    n = verl_class_tool(e("notepad_tool.NotepadTool"), F)
    out["texts"] = [runner.submit_stateful(("a", 0, False), n, {{"note": x}}, {{"create_kwargs": {{"owner": "o"}}}}).result().text
                    for x in "xy"]
    t = time.monotonic()
    o = runner.submit_stateful(("b", 0, False), verl_class_tool(e("hostile_tool.HangsInCreate"), F), {{}}, {{}}).result()
    out["hang"] = [o.status, time.monotonic() - t]
    runner.sessions.release([("a", 0, False)]).result()
    out["alive"] = runner.sessions.alive()
    runner.close()
print(json.dumps(out))
'''
    proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "env", "-i",
                           f"PYTHONPATH={repo}:{site}", str(system), "-c", script],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if res["reason"] is not None:
        assert "allow_unsandboxed" in res["reason"]
        return
    assert res["texts"] == ["notes of o (call 1): x", "notes of o (call 2): x, y"]
    assert res["hang"][0] == "timeout" and res["hang"][1] < 4 and res["alive"] == 0
