"""Multi-turn rollouts under the loop simulator: turns that end with tool calls, tools with a long tail of
latency and timeouts, syncs and checkpoints in the middle of tool calls — the real cores keep every property,
and the multi-turn checks catch a core that breaks the loss mask or aborts a tool wait at a sync."""

from __future__ import annotations

from typer.testing import CliRunner

from asyncrl_cli.app import app
from engine.loop.agent import AgentConversation
from engine.loop.rollout import RolloutLoop
from engine.loop.sim.runner import run_scenario, scenario_seeds
from engine.loop.sim.scenario import Scenario, draw


def test_hundreds_of_multi_turn_scenarios_keep_every_property() -> None:
    drawn = [draw(s, multi_turn=True) for s in scenario_seeds(300, 27)]
    outs = [run_scenario(s) for s in drawn]
    assert [v for o in outs for v in o.violations] == []
    assert all(o.multi_turn for o in outs)
    assert sum(o.finished for o in outs) > 250
    assert sum(o.tool_answers for o in outs) > 1000  # the tools ran, a lot
    # and syncs happened while calls were out — never in deterministic mode, whose sync waits for the calls
    assert sum(o.syncs_during_tools for s, o in zip(drawn, outs) if not s.deterministic) > 50
    assert sum(s.deterministic for s in drawn) > 30
    assert sum(o.syncs_during_tools for s, o in zip(drawn, outs) if s.deterministic) == 0


def test_simulate_check_draws_multi_turn_scenarios() -> None:
    result = CliRunner().invoke(app, ["simulate", "--check", "--scenarios", "60", "--seed", "3", "--multi-turn"])
    assert result.exit_code == 0, result.output
    assert "60 scenarios, 0 violations" in result.output and "60 multi-turn" in result.output


def _tool_heavy(seed: int) -> Scenario:
    """Every turn calls a slow tool (long tail, timeouts), syncs every step."""
    return Scenario(seed=seed, n=2, ppo_mini_batch_size=2, trigger=1, staleness_threshold=0.5, total_prompts=16,
                    max_new_tokens=16, multi_turn=True, max_assistant_turns=3, tool_call_p=1.0, tool_latency=0.1,
                    tool_tail=0.2, tool_timeout=1.0, tool_answer_tokens=3)


def test_a_loss_mask_that_trains_a_tool_answer_is_caught(monkeypatch) -> None:
    assert run_scenario(_tool_heavy(1)).violations == []

    def unmasked(self, answer_ids):  # the bug: tool tokens counted as the model's
        cmd = orig(self, answer_ids)
        self.loss_mask[-len(answer_ids):] = [1] * min(len(answer_ids), len(self.loss_mask))
        return cmd

    orig = AgentConversation.on_tool_answers
    monkeypatch.setattr(AgentConversation, "on_tool_answers", unmasked)
    assert any("loss-mask" in v for v in run_scenario(_tool_heavy(1)).violations)


def test_a_sync_that_aborts_a_tool_wait_is_caught(monkeypatch) -> None:
    out = run_scenario(_tool_heavy(2))
    assert out.violations == [] and out.syncs_during_tools > 0

    def forgetful(self, version, step):  # the bug (verl #4067): a sync drops the trajectories out on a tool
        for st in self.in_flight.values():
            st.tools.clear()
        return orig(self, version, step)

    orig = RolloutLoop.begin_sync
    monkeypatch.setattr(RolloutLoop, "begin_sync", forgetful)
    assert any("tool-wait" in v for v in run_scenario(_tool_heavy(2)).violations)


def _validating_with_tools(seed: int) -> Scenario:
    """`_tool_heavy` with a validation every 2 versions whose conversations call the slow tool too."""
    s = _tool_heavy(seed)
    s.val_prompts, s.test_freq = 3, 2
    return s


def test_validation_conversations_call_tools_and_a_sync_waits_for_them(monkeypatch) -> None:
    outs = [run_scenario(_validating_with_tools(seed)) for seed in range(4)]
    assert [v for o in outs for v in o.violations] == []
    assert all(o.finished for o in outs)

    def old_validating(self):  # the bug: a validation waiting on its tools is not "running"
        return bool(self.val_pending) or self.dispatches.any("val")

    monkeypatch.setattr(RolloutLoop, "validating", old_validating)
    broken = [v for seed in range(4) for v in run_scenario(_validating_with_tools(seed)).violations]
    assert any(v.startswith("validation") or "validation" in v for v in broken), broken[:3]


def test_a_trajectory_that_never_releases_its_tools_is_caught(monkeypatch) -> None:
    """`ReleaseTools` ends each trajectory's stateful tools; forgetting it for a finished trajectory (its box
    would outlive it) is a violation at its `Put`."""
    assert run_scenario(_tool_heavy(3)).violations == []

    def leaky(self, st, i, end):  # the bug: a conversation that ends on a tool answer keeps its tools
        return [c for c in orig(self, st, i, end) if type(c).__name__ != "ReleaseTools"]

    orig = RolloutLoop._agent_done
    monkeypatch.setattr(RolloutLoop, "_agent_done", leaky)
    assert any("tools-release" in v for v in run_scenario(_tool_heavy(3)).violations)
