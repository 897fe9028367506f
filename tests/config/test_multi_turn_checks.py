"""`[rollout.multi_turn]` in validate: tools that exist, verl tool configs asyncrl can run, and no
multi-turn in deterministic mode."""

from __future__ import annotations

from pathlib import Path

from asyncrl_cli.config.loader import analyze_run_config
from asyncrl_cli.config.problems import EXIT_INVALID, EXIT_OK

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
ON = "rollout.multi_turn.enable=true"


def codes(an) -> list[str]:
    return [p.code for p in an.problems]


def test_multi_turn_needs_tools_that_exist():
    assert analyze_run_config(TINY, [ON, 'rollout.multi_turn.tools=["calculator"]']).exit_code == EXIT_OK
    an = analyze_run_config(TINY, [ON])
    assert an.exit_code == EXIT_INVALID and "multi-turn-no-tools" in codes(an)
    an = analyze_run_config(TINY, [ON, 'rollout.multi_turn.tools=["search"]'])
    assert an.exit_code == EXIT_INVALID and "multi-turn-tools" in codes(an)


def test_a_verl_tool_config_with_a_tool_asyncrl_cannot_run_is_refused_by_name(tmp_path):
    cfg = tmp_path / "tools.yaml"
    cfg.write_text("tools:\n  - class_name: verl.tools.search_tool.SearchTool\n"
                   "    tool_schema: {type: function, function: {name: search}}\n")
    an = analyze_run_config(TINY, [ON, f"rollout.multi_turn.tool_config_path={cfg}"])
    assert an.exit_code == EXIT_INVALID
    (p,) = [p for p in an.problems if p.code == "multi-turn-tools"]
    assert "SearchTool" in p.message


def test_multi_turn_is_refused_in_deterministic_mode_and_its_keys_warn_when_off():
    an = analyze_run_config(TINY, [ON, 'rollout.multi_turn.tools=["calculator"]', "trainer.deterministic=true"])
    assert an.exit_code == EXIT_INVALID and "deterministic-unsupported" in codes(an)
    an = analyze_run_config(TINY, ['rollout.multi_turn.tools=["calculator"]'])
    assert an.exit_code == EXIT_OK and "multi-turn-off" in codes(an)
