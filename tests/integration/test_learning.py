"""The product's promise on CPU: real learning through the fully async loop.

- `tiny-cpu` as shipped: the mean reward of the last quarter of steps exceeds the first quarter's by ≥ 0.3,
  and validation (exact answer + EOS) reaches ≥ 0.5 at the last validation.
- `smollm2-arith-cpu` (the demo, slow: `make test-slow`): greedy validation accuracy rises by ≥ 0.15 from the
  first to the last validation.
"""

from __future__ import annotations

import pytest
from run_helpers import REPO, read_jsonl, tiny_config, train_records

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration


@pytest.mark.slow  # the whole 400-step preset (~3 min on 2 cores); the short learning runs stay in `make test`
def test_tiny_preset_learns(run_dir):
    cfg = tiny_config(run_dir)
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert len(recs) == 400
    q = len(recs) // 4
    first = sum(r["critic/rewards/mean"] for r in recs[:q]) / q
    last = sum(r["critic/rewards/mean"] for r in recs[-q:]) / q
    assert last - first >= 0.3, (first, last)
    assert max(r["asyncrl/staleness/max"] for r in recs) >= 1  # it really ran off-policy
    vals = [next(v for k, v in r.items() if k.startswith("val-core/"))
            for r in read_jsonl(run_dir / "metrics.jsonl") if any(k.startswith("val-core/") for k in r)]
    assert vals and vals[-1] >= 0.5, vals  # the reward pays for what validation counts


@pytest.mark.slow
def test_demo_validation_accuracy_rises(run_dir):
    cfg = tiny_config(run_dir, preset=REPO / "presets" / "runs" / "smollm2-arith-cpu.toml")
    assert run(resolve_plan(cfg), progress=False) == 0
    vals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if any(k.startswith("val-core/") for k in r)]
    accs = [next(v for k, v in r.items() if k.startswith("val-core/")) for r in vals]
    assert len(accs) >= 3
    assert accs[-1] - accs[0] >= 0.15, accs
