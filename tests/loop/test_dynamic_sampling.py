"""Dynamic sampling (`algorithm.filter_groups`) in the trainer's core: a pulled group whose responses all scored
alike is dropped at once (and released from the rollout budget by the shell), the trainer pulls on until a
step has `required_samples` groups that carry a gradient, and the simulator's random runs keep every invariant
(the ledger exact: each prompt trained once or dropped once) with it on."""

from __future__ import annotations

import pytest

from engine.loop.commands import Drop, PollControl, Train
from engine.loop.sim.scenario import draw
from engine.loop.sim.world import World
from engine.loop.trainer import TrainerLoop, TrainerParams, informative
from engine.types import Prompt, Trajectory, TrajectoryGroup


def group(i: int, rewards: list[float], acc: list[float] | None = None) -> TrajectoryGroup:
    trajs = [Trajectory([5], [-1.0], "stop", 0, 0, reward=r,
                        reward_info={} if acc is None else {"acc": acc[j]}) for j, r in enumerate(rewards)]
    return TrajectoryGroup(Prompt(f"0:{i}", i, 0, [1, 2]), trajs)


def loop(metric: str | None = "score", required: int = 2) -> TrainerLoop:
    return TrainerLoop(TrainerParams(required_samples=required, trigger=1, total_local_steps=10,
                                     filter_metric=metric))


def test_uniform_groups_are_dropped_and_the_trainer_pulls_on_until_a_batch_carries_a_gradient() -> None:
    core = loop()
    flat, mixed = group(0, [1.0, 1.0, 1.0]), group(1, [0.0, 1.0, 0.0])
    cmds = core.pulled([flat, mixed], closed=False)
    assert cmds[0] == Drop((flat,), "filtered") and isinstance(cmds[-1], PollControl)  # one group short: pull on
    assert core.buffer == [mixed] and core.filtered_groups == 1
    later = group(2, [0.1, 1.1, 1.1])
    cmds = core.pulled([group(3, [0.0, 0.0, 0.0]), later], closed=False)
    assert [type(c) for c in cmds] == [Drop, Train] and cmds[-1].groups == (mixed, later)
    assert core.filtered_groups == 2 and core.state()["filtered_groups"] == 2


def test_without_filter_groups_every_group_is_trained() -> None:
    core = loop(metric=None)
    flat = [group(0, [1.0, 1.0]), group(1, [0.0, 0.0])]
    assert core.pulled(flat, closed=False) == [Train(tuple(flat))]


def test_the_metric_decides_what_must_vary() -> None:
    g = group(0, [1.1, 0.1], acc=[0.0, 0.0])  # the format bonus varies, the answer does not
    assert informative(g, "score") and informative(g, "seq_reward") and not informative(g, "acc")
    assert informative(group(1, [1.0]), "score")  # one response: kept, as verl keeps it
    with pytest.raises(ValueError, match="returned no 'acc'"):
        informative(group(2, [0.0, 1.0]), "acc")


def test_the_count_of_filtered_groups_survives_a_checkpoint() -> None:
    core = loop()
    core.pulled([group(0, [0.0, 0.0]), group(1, [1.0, 1.0])], closed=False)
    again = loop()
    again.restore(core.state())
    assert again.filtered_groups == 2


def test_a_stream_of_uniform_groups_ends_the_run_when_the_prompts_run_out() -> None:
    core = loop()
    flat = (group(0, [0.0, 0.0]), group(1, [1.0, 1.0]))
    cmds = core.pulled(list(flat), closed=True)
    assert cmds[0] == Drop(flat, "filtered") and core.finished() and core.local_step == 0


def test_simulated_runs_with_dynamic_sampling_keep_every_invariant() -> None:
    """Random scenarios with filter_groups on (groups uniform with probability 0, 0.3, 0.7 or 1; stops, knob
    changes, checkpoints and deaths as drawn): no violation, and uniform groups are really dropped."""
    seeds = [s for s in range(400) if draw(s).filter_groups][:80]
    assert len(seeds) == 80
    filtered = 0
    for s in seeds:
        world = World(draw(s))
        out = world.run()
        assert not out.violations, (s, out.violations[:3])
        filtered += world.trainer.filtered_groups
    assert filtered > 0
