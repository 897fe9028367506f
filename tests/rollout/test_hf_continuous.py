"""Continuous batching in the `hf` backend: concurrent `generate` calls share one running batch; requests
join it at the next decode step and leave when done; each call returns with its own requests; an abort
ends every call at a token boundary; per-token log-probs are those of each row alone."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, GenResult, Trajectory

PAD, NEVER = 0, 999  # an EOS id outside the vocabulary: rows run to their budget
GREEDY = SamplingParams(temperature=0.0)


def reqs(tag: str, count: int, budget: int, seed: int) -> list[GenRequest]:
    gen = torch.Generator().manual_seed(seed)
    return [GenRequest(f"{tag}{i}", torch.randint(2, 32, (3 + (i % 4),), generator=gen).tolist(),
                       max_new_tokens=budget) for i in range(count)]


class Gate:
    """`should_abort` that never aborts but opens `event` once `after` polls happened (the call runs)."""

    def __init__(self, after: int) -> None:
        self.after, self.polls, self.event = after, 0, threading.Event()

    def __call__(self) -> bool:
        self.polls += 1
        if self.polls >= self.after:
            self.event.set()
        return False


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target() -> None:
        box["out"] = fn(*args, **kwargs)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def test_a_call_joins_the_running_batch_and_returns_before_the_longer_one(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=NEVER, pad_token_id=PAD, max_batch_size=8)
    long_reqs, short_reqs = reqs("long", 3, 40, seed=1), reqs("short", 4, 3, seed=2)
    alone_long = backend.generate(long_reqs, GREEDY)
    alone_short = backend.generate(short_reqs, GREEDY)
    steps_alone = backend.stats()["decode_steps"]

    gate = Gate(after=4)
    t, box = in_thread(backend.generate, long_reqs, GREEDY, should_abort=gate)
    assert gate.event.wait(30)
    assert backend.capacity() == 8 - 3  # three rows running
    short = backend.generate(short_reqs, GREEDY)  # joins the running batch
    assert t.is_alive(), "the short call must come back while the long one still runs"
    t.join(60)
    long = box["out"]
    for got, ref in zip(long + short, alone_long + alone_short):
        assert got.response_ids == ref.response_ids
        assert got.log_probs == pytest.approx(ref.log_probs, abs=1e-5)
        assert got.finish_reason == "length"
    # the short rows rode along: no decode step of their own
    assert backend.stats()["decode_steps"] - steps_alone == 39
    assert backend.capacity() == 8


def test_rows_wait_for_a_free_row_and_results_do_not_depend_on_max_rows(tiny_lm) -> None:
    model = tiny_lm()
    small = HFRolloutBackend(copy.deepcopy(model), eos_token_id=1, pad_token_id=PAD, max_batch_size=3)
    large = HFRolloutBackend(copy.deepcopy(model), eos_token_id=1, pad_token_id=PAD, max_batch_size=64)
    rs = reqs("r", 10, 12, seed=3)
    a, b = small.generate(rs, GREEDY), large.generate(rs, GREEDY)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    for x, y in zip(a, b):
        assert x.log_probs == pytest.approx(y.log_probs, abs=1e-5)
    assert small.stats()["decode_row_steps"] == small.stats()["tokens_generated"]


def test_abort_ends_every_running_call_at_a_token_boundary_and_resume_completes_them(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=NEVER, pad_token_id=PAD, max_batch_size=4)
    first, second = reqs("a", 3, 30, seed=4), reqs("b", 3, 30, seed=5)  # 6 rows, 4 fit: 2 wait
    reference = {r.request_id: r for r in backend.generate(first + second, GREEDY)}
    flag = threading.Event()
    gate = Gate(after=5)

    def should_abort() -> bool:
        gate()
        return flag.is_set()

    t1, box1 = in_thread(backend.generate, first, GREEDY, should_abort=should_abort)
    assert gate.event.wait(30)
    gate2 = Gate(after=3)

    def should_abort2() -> bool:
        gate2()
        return flag.is_set()

    t2, box2 = in_thread(backend.generate, second, GREEDY, should_abort=should_abort2)
    assert gate2.event.wait(30)  # the second call is in the batch (one row of it still waiting)
    flag.set()  # what RolloutReplica.abort() does: every call ends at the next boundary
    t1.join(30)
    t2.join(30)
    partial: list[GenResult] = box1["out"] + box2["out"]
    assert all(r.finish_reason == "abort" for r in partial)
    assert any(r.response_ids for r in partial)
    for r in partial:
        ref = reference[r.request_id]
        assert r.response_ids == ref.response_ids[: len(r.response_ids)]
        assert r.log_probs == pytest.approx(ref.log_probs[: len(r.log_probs)], abs=1e-5)
    by_id = {r.request_id: r for r in first + second}
    resumed = backend.generate([GenRequest(r.request_id, by_id[r.request_id].prompt_ids, r.response_ids,
                                           r.log_probs, 30 - len(r.response_ids), r.min_version)
                                for r in partial], GREEDY)
    for r in resumed:
        assert r.response_ids == reference[r.request_id].response_ids
        assert r.log_probs == pytest.approx(reference[r.request_id].log_probs, abs=1e-5)
    assert backend.capacity() == 4


def test_sampled_rows_that_joined_mid_batch_match_the_trainer(tiny_lm) -> None:
    model = tiny_lm()
    backend = HFRolloutBackend(copy.deepcopy(model), eos_token_id=1, pad_token_id=PAD, max_batch_size=6)
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3}, micro_batch_size=8, temperature=1.0)
    sampling = SamplingParams(temperature=1.0, seed=9)
    gate = Gate(after=3)
    early, late = reqs("e", 4, 16, seed=6), reqs("l", 5, 16, seed=7)
    t, box = in_thread(backend.generate, early, sampling, should_abort=gate)
    assert gate.event.wait(30)
    joined = backend.generate(late, SamplingParams(temperature=1.0, seed=10))
    t.join(60)
    results = box["out"] + joined
    rows = [(q.prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, r.min_version, r.max_version))
            for q, r in zip(early + late, results)]
    batch = collate(rows, pad_token_id=PAD)
    log_probs, _ = trainer.compute_log_probs(batch)
    mask = batch.response_mask.bool()
    assert float((log_probs - batch.rollout_log_probs)[mask].abs().max()) < 1e-4


def test_an_error_reaches_the_caller_and_the_backend_keeps_serving(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=1, pad_token_id=PAD)

    def broken() -> bool:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        backend.generate(reqs("x", 2, 4, seed=8), GREEDY, should_abort=broken)
    assert all(r.response_ids for r in backend.generate(reqs("y", 2, 4, seed=8), GREEDY))


def test_samples_of_a_prompt_joining_at_different_steps_share_one_prefill(tiny_lm) -> None:
    model = tiny_lm()
    backend = HFRolloutBackend(copy.deepcopy(model), eos_token_id=1, pad_token_id=PAD, max_batch_size=3)
    prompt = [5, 9, 2, 7, 11]
    group = [GenRequest(f"s{j}", prompt, max_new_tokens=3 + j) for j in range(8)]  # rows free one by one
    results = backend.generate(group, SamplingParams(temperature=1.0, seed=2))
    assert backend.stats()["prefill_tokens"] == len(prompt)  # eight samples, three rows, one prefill
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3}, micro_batch_size=8, temperature=1.0)
    batch = collate([(prompt, Trajectory(r.response_ids, r.log_probs, r.finish_reason, r.min_version,
                                         r.max_version)) for r in results], pad_token_id=PAD)
    log_probs, _ = trainer.compute_log_probs(batch)
    assert float((log_probs - batch.rollout_log_probs)[batch.response_mask.bool()].abs().max()) < 1e-4


def test_set_threads_takes_effect_in_the_decode_thread_at_the_next_decode_step(tiny_lm) -> None:
    """Elastic cores: `set_threads(n)` is applied with `torch.set_num_threads` by the decode thread at its next
    iteration — also in the middle of a running call — and the decode steps report what they ran with."""
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=NEVER, pad_token_id=PAD, max_batch_size=8)
    backend.set_threads(1)
    backend.generate(reqs("a", 2, 5, seed=1), GREEDY)
    assert backend.take_thread_stats() == {"applied": 1.0, "mean": 1.0}
    backend.set_threads(2)
    backend.generate(reqs("b", 2, 5, seed=2), GREEDY)
    assert backend.take_thread_stats() == {"applied": 2.0, "mean": 2.0}
    backend.set_threads(1)
    gate = Gate(after=4)
    t, box = in_thread(backend.generate, reqs("long", 2, 40, seed=3), GREEDY, should_abort=gate)
    assert gate.event.wait(30)
    backend.set_threads(2)  # lands between two decode steps of the running call
    t.join(60)
    assert all(r.finish_reason == "length" for r in box["out"])
    st = backend.take_thread_stats()
    assert st["applied"] == 2.0 and 1.0 < st["mean"] < 2.0
