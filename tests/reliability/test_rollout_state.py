"""The checkpoint form of in-flight prompts and the prompt stream's position."""

from __future__ import annotations

import json

from engine.loop.stream import PromptStream, prompts_of
from engine.loop.inflight import InFlight, in_flight_from_json, in_flight_summary, in_flight_to_json
from engine.types import GenRequest, Prompt, Trajectory

PROMPT = Prompt("0:7", 7, 0, [5, 6, 7], ground_truth="67", data_source="asyncrl/copy")


def _state() -> InFlight:
    st = InFlight(PROMPT, admitted_at=1.0, admitted_version=3)
    st.done[0] = Trajectory([1, 2], [-0.1, -0.2], "stop", 3, 3, reward=1.0)
    st.pending[1] = GenRequest("0:7#1", PROMPT.prompt_ids, prefix_ids=[9], prefix_log_probs=[-0.5],
                               max_new_tokens=3, min_version=2)  # aborted at a sync: resumes from its prefix
    st.running = {2, 3}
    return st


def test_a_checkpointed_prompt_keeps_its_finished_and_partial_trajectories() -> None:
    dispatched = {"0:7#2": GenRequest("0:7#2", PROMPT.prompt_ids, prefix_ids=[4, 4], prefix_log_probs=[-1.0, -1.0],
                                      max_new_tokens=2, min_version=1)}
    d = json.loads(json.dumps(in_flight_to_json(_state(), dispatched)))  # survives JSON
    st = in_flight_from_json(d, n=4, max_new_tokens=4, keep_prefixes=True, now=5.0)
    assert st.prompt == PROMPT and st.admitted_version == 3 and st.admitted_at == 5.0
    assert st.done == {0: Trajectory([1, 2], [-0.1, -0.2], "stop", 3, 3, reward=1.0)}
    assert st.pending[1].prefix_ids == [9] and st.pending[1].min_version == 2 and st.pending[1].max_new_tokens == 3
    assert st.pending[2] == dispatched["0:7#2"]  # on a replica at the cut: re-issued as it was dispatched
    assert st.pending[3] == GenRequest("0:7#3", PROMPT.prompt_ids, max_new_tokens=4)  # nothing saved: from scratch
    assert not st.running
    assert in_flight_summary([st]) == {"prompts": 1, "trajectories": 3, "with_prefix": 2}


def test_without_partial_rollout_unfinished_trajectories_restart_from_the_prompt() -> None:
    d = in_flight_to_json(_state(), {})
    st = in_flight_from_json(d, n=4, max_new_tokens=4, keep_prefixes=False, now=0.0)
    assert set(st.pending) == {1, 2, 3} and 0 in st.done
    assert all(not r.prefix_ids and r.max_new_tokens == 4 and r.min_version is None for r in st.pending.values())


def _epochs(epoch: int) -> list[Prompt]:
    order = list(range(5)) if epoch % 2 == 0 else [4, 2, 0, 3, 1]
    return [Prompt(f"{epoch}:{i}", i, epoch, [i + 1]) for i in order]


def test_the_prompt_stream_continues_exactly_from_a_saved_position() -> None:
    expected = [p.uid for p in prompts_of(PromptStream(total_epochs=3, total=12), _epochs)]
    assert len(expected) == 12
    first = PromptStream(total_epochs=3, total=12)
    it = prompts_of(first, _epochs)
    head = [next(it).uid for _ in range(7)]
    second = PromptStream(total_epochs=3, total=12)
    second.restore(json.loads(json.dumps(first.state())))
    assert second.needs() == first.state()["epoch"]  # a restored stream asks for its epoch's prompts again
    assert head + [p.uid for p in prompts_of(second, _epochs)] == expected
