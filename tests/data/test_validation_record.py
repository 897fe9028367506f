"""Validation metrics are named for what they hold, as verl names them (`val-core/<source>/acc/mean@1`)."""

from __future__ import annotations

import pytest

from engine.config.sections import DataConfig
from engine.runtime.scoring import Scorer, validation_record
from engine.plan.role_parts import scoring_spec
from engine.types import GenResult, Prompt


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _cfg(reward: str):
    return scoring_spec(DataConfig(train_files=["x.parquet"], reward=reward))


def _prompt(i: int, source: str, truth: str) -> Prompt:
    return Prompt(uid=f"0:{i}", index=i, epoch=0, prompt_ids=[1], ground_truth=truth, data_source=source)


def _answer(ids: list[int]) -> GenResult:
    return GenResult("0:0#0", ids, [0.0] * len(ids), "stop", 0, 0)


def test_accuracy_is_core_and_the_shaped_reward_goes_beside_it_in_val_aux() -> None:
    """The built-in `copy` reward gives partial credit (half for the digits, half for stopping right after as
    many characters as the target has) but acc only for an exact copy."""
    scorer = Scorer(_cfg("copy"), _Tok())
    scored = [(_prompt(0, "copy", "abc"), _answer([0, 1, 2])), (_prompt(1, "copy", "abc"), _answer([0, 1, 5]))]
    rec, summary = validation_record(scorer, scored, version=3, step=12)
    assert rec == {"training/global_step": 12, "fully_async/count/current_param_version": 3,
                   "val-core/copy/acc/mean@1": 0.5, "val-aux/copy/reward/mean@1": pytest.approx((1 + (0.5 * 2 / 3 + 0.5)) / 2),
                   # the reward's other info, as verl logs its reward extra info
                   "val-aux/copy/partial/mean@1": pytest.approx((1 + 2 / 3) / 2), "val-aux/copy/stop/mean@1": 1.0}
    assert summary == "copy=0.500"


def test_a_reward_without_acc_is_core_under_its_own_name(tmp_path, monkeypatch) -> None:
    (tmp_path / "plain_reward.py").write_text("def score(response_text, ground_truth, **kw):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    scorer = Scorer(_cfg("plain_reward.py:score"), _Tok())
    rec, summary = validation_record(scorer, [(_prompt(0, "mine", "x"), _answer([1]))], version=1, step=4)
    assert rec["val-core/mine/reward/mean@1"] == 0.25 and not any("/acc/" in k for k in rec)
    assert summary == "mine reward=0.250"


def test_n_answers_per_prompt_give_verls_mean_best_and_maj_at_n_in_val_core() -> None:
    """Two answers per prompt with the `copy` reward (its `pred` is the answer text: majority voting):
    prompt 0 right then wrong, prompt 1 wrong twice."""
    scorer = Scorer(_cfg("copy"), _Tok())
    p0, p1 = _prompt(0, "copy", "abc"), _prompt(1, "copy", "abc")
    scored = [(p0, _answer([0, 1, 2])), (p0, _answer([0, 1, 5])), (p1, _answer([3])), (p1, _answer([3]))]
    rec, summary = validation_record(scorer, scored, version=1, step=2)
    assert rec["val-core/copy/acc/mean@2"] == 0.25  # (1/2 + 0) / 2
    assert rec["val-aux/copy/acc/std@2"] == 0.25  # (0.5 + 0) / 2
    assert sorted(k for k in rec if k.startswith("val-core/")) == [
        "val-core/copy/acc/best@2/mean", "val-core/copy/acc/best@2/std", "val-core/copy/acc/maj@2/mean",
        "val-core/copy/acc/maj@2/std", "val-core/copy/acc/mean@2"]
    # prompt 1 never wins; prompt 0 wins a draw holding its first answer: P = 3/4, so best@2 ≈ 0.75 / 2
    assert abs(rec["val-core/copy/acc/best@2/mean"] - 0.375) < 0.03
    assert summary == "copy=0.250 (mean@2)"
