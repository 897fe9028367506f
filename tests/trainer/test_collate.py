"""`collate` / `split_micro_batches` / `trim_padding`: the padded layout the trainer relies on."""

from __future__ import annotations

import pytest
import torch

from engine.trainer.batch import collate, split_micro_batches, trim_padding
from engine.types import Prompt, Trajectory, TrajectoryGroup

EOS = PAD = 1  # pad == eos, as with SmolLM2's tokenizer


def traj(ids: list[int], reward: float = 0.0, reason: str = "stop", versions: tuple[int, int] = (0, 0)) -> Trajectory:
    return Trajectory(ids, [-0.1 * (i + 1) for i in range(len(ids))], reason, versions[0], versions[1], reward)


def groups() -> list[TrajectoryGroup]:
    return [
        TrajectoryGroup(Prompt("0:0", 0, 0, [5, 6, 7]), [traj([8, EOS], 1.0), traj([9, 9, 9, 9], 0.0, "length")]),
        TrajectoryGroup(Prompt("0:1", 1, 0, [4]), [traj([EOS], 0.5, versions=(1, 2))]),
    ]


def test_left_padded_prompts_right_padded_responses() -> None:
    b = collate(groups(), pad_token_id=PAD)
    assert b.input_ids.tolist() == [
        [5, 6, 7, 8, EOS, PAD, PAD],
        [5, 6, 7, 9, 9, 9, 9],
        [PAD, PAD, 4, EOS, PAD, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [1] * 7, [0, 0, 1, 1, 0, 0, 0]]
    assert b.position_ids.tolist()[2][:4] == [0, 0, 0, 1]
    assert b.prompt_len == 3 and b.responses.tolist()[0] == [8, EOS, PAD, PAD]
    # EOS is inside the response mask even though it equals the pad id
    assert b.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert b.rollout_log_probs[0].tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0])
    assert b.meta["group_index"].tolist() == [0, 0, 1]
    assert b.meta["uids"] == ["0:0", "0:0", "0:1"]
    assert b.meta["rewards"].tolist() == [1.0, 0.0, 0.5]
    assert b.meta["max_versions"].tolist() == [0, 0, 2] and b.meta["min_versions"].tolist() == [0, 0, 1]


def test_rows_and_truncation() -> None:
    rows = [([3, 4, 5, 6], traj([7, 8, 9])), ([2], traj([EOS]))]
    b = collate(rows, pad_token_id=0, max_prompt_len=2, max_response_len=2)
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [0, 2, EOS, 0]]
    assert b.response_mask.tolist() == [[1, 1], [1, 0]]
    assert b.meta["group_index"].tolist() == [0, 1]


def test_split_micro_batches_and_trim() -> None:
    b = collate(groups(), pad_token_id=PAD)
    micros = split_micro_batches(b, 2)
    assert [len(m) for m in micros] == [2, 1]
    assert torch.equal(torch.cat([m.input_ids for m in micros]), b.input_ids)
    trimmed, width = trim_padding(micros[1])
    assert width == 4
    assert trimmed.input_ids.tolist() == [[4, EOS]] and trimmed.response_mask.tolist() == [[1.0]]
    with pytest.raises(ValueError):
        split_micro_batches(b, 0)


def test_rejects_misaligned_log_probs() -> None:
    bad = Trajectory([3, 4], [-0.1], "stop", 0, 0)
    with pytest.raises(ValueError):
        collate([([2], bad)], pad_token_id=0)
