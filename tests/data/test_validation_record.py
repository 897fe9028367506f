"""Validation metrics are named for what they hold, as verl names them (`val-core/<source>/acc/mean@1`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.runtime.scoring import Scorer, validation_record
from engine.types import Prompt


def test_accuracy_is_core_and_the_shaped_reward_goes_beside_it() -> None:
    rec, summary = validation_record({"math": [(1.0, 1.0), (0.1, 0.0)], "copy": [(0.5, None), (1.0, None)]},
                                     step=12, version=3)
    assert rec == {"training/global_step": 12, "fully_async/count/current_param_version": 3,
                   "val-core/math/acc/mean@1": 0.5, "val-aux/math/reward/mean@1": pytest.approx(0.55),
                   "val-core/copy/reward/mean@1": 0.75}
    assert summary == "math acc=0.500 (reward 0.550), copy reward=0.750"
    assert not any(k.endswith("/reward/mean@1") and k.startswith("val-core/math") for k in rec)


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def test_a_real_reward_reports_acc_apart_from_its_shaped_score() -> None:
    """The built-in `copy` reward gives partial credit (score) but acc only for an exact copy."""
    cfg = SimpleNamespace(data=SimpleNamespace(reward="copy"))
    scorer = Scorer(cfg, _Tok())
    prompt = Prompt(uid="0:0", index=0, epoch=0, prompt_ids=[1], ground_truth="abc", data_source="copy")
    assert scorer.validation_scores(prompt, [0, 1, 2], "stop") == (1.0, 1.0)
    reward, acc = scorer.validation_scores(prompt, [0, 1, 5], "stop")
    assert acc == 0.0 and reward == pytest.approx(2 / 3)
    rec, _ = validation_record({"copy": [(reward, acc)]}, step=1, version=0)
    assert rec["val-core/copy/acc/mean@1"] == 0.0 and rec["val-aux/copy/reward/mean@1"] == pytest.approx(2 / 3)
