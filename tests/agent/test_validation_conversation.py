"""Multi-turn validation through the rollouter's real parts: the `RolloutLoop` core, the `ToolShell` (parse
the turn's text, run the tool in the sandbox, render its answer through the tokenizer) and the `Scorer` with
the task's reward — a validation answer is the whole conversation, scored on what the model wrote after the
tool's answer. The model's turns are given as text (the tiny model samples a call too rarely to be greedy)."""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl_cli.config import load_run_config
from engine.loop.commands import CallTools, Dispatch, ReleaseTools, ValidationDone
from engine.loop.rollout import RolloutLoop
from engine.loop.stream import PromptStream
from engine.models.loader import load_tokenizer, resolve_model_path
from engine.loop.params import loop_params
from engine.plan.sizes import derive
from engine.runtime.scoring import Scorer, validation_record
from engine.plan.role_parts import scoring_spec
from engine.runtime.tool_shell import ToolShell
from engine.types import GenResult, Prompt

PRESET = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-tools-cpu.toml"


def _model_turn(tok, req, text: str, version: int) -> GenResult:
    ids = list(tok.encode(text, add_special_tokens=False)) + [tok.eos_token_id]
    return GenResult(req.request_id, list(req.prefix_ids) + ids, list(req.prefix_log_probs) + [-0.1] * len(ids),
                     "stop", version, version, len(ids))


def _answers(shell: ToolShell, timeout_s: float = 30.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = shell.ready()
        if done:
            return done
        time.sleep(0.05)
    raise AssertionError("the tool never answered")


def test_a_validation_conversation_calls_its_tool_and_is_scored_on_its_last_turn(tmp_path):
    cfg = load_run_config(PRESET, [f'logging.run_dir="{tmp_path}"']).config
    tok = load_tokenizer(resolve_model_path(cfg.model.path))
    shell, scorer = ToolShell(cfg.rollout.multi_turn, tok), Scorer(scoring_spec(cfg.data), tok)
    prompts = [Prompt(f"0:{k}", k, 0, list(tok.encode("secret=", add_special_tokens=False)), ground_truth=secret,
                      data_source="asyncrl/lookup", extra_info={"tools_kwargs": {"lookup": {"create_kwargs": {
                          "secret": secret}}}}) for k, secret in enumerate(("381", "907"))]
    loop = RolloutLoop(loop_params(cfg, derive(cfg, train_size=8).total_rollout_steps).rollout, PromptStream(1, 0), prompts, 1)
    loop.queue_validation(3)
    try:
        (d,) = [c for c in loop.tick(0.0) if isinstance(c, Dispatch)]
        first = [_model_turn(tok, d.requests[0], "lookup", 3), _model_turn(tok, d.requests[1], "123", 3)]
        calls = shell.parse(first, loop.turn_start, validation=True)
        cmds = loop.generation_finished(0, first, 0.1, d.dispatch_id, calls)
        assert [type(c) for c in cmds] == [CallTools] and cmds[0].validation and cmds[0].uid == "0:0"
        shell.start(cmds[0])
        ((uid, index, answer_ids, validation),) = _answers(shell)
        assert (uid, index, validation) == ("0:0", 0, True)
        assert tok.decode(answer_ids).replace("\n", "") == "<tool_response>381</tool_response>"
        assert loop.tools_done(uid, index, answer_ids, validation) == []
        (d2,) = [c for c in loop.tick(0.2) if isinstance(c, Dispatch)]
        (req,) = d2.requests
        assert req.prefix_ids[-len(answer_ids):] == answer_ids
        last = _model_turn(tok, req, "381", 3)
        release, done = loop.generation_finished(0, [last], 0.3, d2.dispatch_id,
                                                 shell.parse([last], loop.turn_start, validation=True))
        assert release == ReleaseTools((("0:0", 0, True),))  # the conversation that called its tool ended
        shell.release(release)
    finally:
        shell.close()
    assert isinstance(done, ValidationDone) and (done.turns, done.tool_calls) == ((2, 1), (1, 0))
    text = tok.decode(done.results[0].response_ids, skip_special_tokens=True).replace("\n", "")
    assert text == "lookup<tool_response>381</tool_response>381"  # the call, the tool's answer, the final answer
    rec, summary = validation_record(scorer, list(zip(prompts, done.results)), version=3, step=6,
                                     turns=list(done.turns), tool_calls=list(done.tool_calls))
    # the lookup reward scores the text after the tool's answer: "381" is exact, the uncalled "123" is not 907
    assert rec["val-core/asyncrl/lookup/acc/mean@1"] == 0.5 and rec["val-aux/asyncrl/lookup/called/mean@1"] == 0.5
    assert rec["val-aux/num_turns/max"] == 2 and rec["val-aux/num_turns/mean"] == 1.5
    assert rec["asyncrl/val/tool_call_rate"] == 0.5 and "tool calls in 50% of answers" in summary
    assert shell.counters()["asyncrl/tools/calls"] == 0  # validation's calls are not training metrics
