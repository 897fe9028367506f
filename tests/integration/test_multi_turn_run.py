"""Multi-turn runs on a real local Ray with the tiny tools model: tools that are slow, time out or raise, a
weight sync every step while calls are out — the trajectories waiting on a tool survive the syncs, the ledger
is exact, and every failure is counted."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from engine.data.builtin import builtin_rows
from engine.plan.run_plan import resolve_plan
from engine.runtime.driver import run
from run_helpers import REPO, read_jsonl, tiny_config, train_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOOLS = REPO / "presets" / "runs" / "tiny-tools-cpu.toml"
PROMPTS = 192
"""12 steps of 16 prompts × 8 samples: the tiny model calls its tool more as it learns (the call earns a bonus)."""
TIMEOUT_S = 1.5
"""The tool's wall-clock limit (the verl config's `default_timeout`)."""
CODES = (
    "import time\ntime.sleep(0.8)\nprint({secret!r})",  # answers, slowly: calls stay out across syncs
    "import time\ntime.sleep(30)",  # sleeps past the timeout
    "raise ValueError('the tool failed')",  # raises
)
"""What the row's `lookup` call runs (verl's `tools_kwargs.<tool>.create_kwargs`, merged over the model's
arguments): row k runs `CODES[k % 3]`."""
TOOL_YAML = f"""tools:
  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
    config: {{default_timeout: {TIMEOUT_S}, memory_limit_mb: 512}}
    tool_schema:
      type: function
      function:
        name: lookup
        description: Look up this problem's secret.
        parameters: {{type: object, properties: {{}}}}
"""


def _flaky_tool_task(tmp: Path) -> tuple[Path, Path]:
    """The `lookup` rows whose tool is verl's code interpreter running `CODES`, and the verl tool config."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = builtin_rows("lookup", "train", size=PROMPTS)
    for k, r in enumerate(rows):
        code = CODES[k % 3].format(secret=r["reward_model"]["ground_truth"])
        r["extra_info"]["tools_kwargs"] = {"lookup": {"create_kwargs": {"code": code}}}
    data = tmp / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    tools = tmp / "tools.yaml"
    tools.write_text(TOOL_YAML)
    return data, tools


def test_tools_that_sleep_time_out_and_raise_across_syncs_keep_an_exact_ledger(run_dir, tmp_path):
    data, tools = _flaky_tool_task(tmp_path)
    cfg = tiny_config(run_dir, f'data.train_files=["{data}"]', "data.val_files=[]", "trainer.test_freq=0",
                      "trainer.val_before_train=false", "trainer.ppo_mini_batch_size=16",
                      "trainer.ppo_micro_batch_size_per_gpu=32", f"rollout.total_rollout_steps={PROMPTS}",
                      "trainer.total_epochs=1", "rollout.multi_turn.tools=[]",
                      f'rollout.multi_turn.tool_config_path="{tools}"', "async_training.trigger_parameter_sync_step=1",
                      # a sync aborts every generating turn and drops its prompt: a trajectory trained with
                      # min_version < max_version crossed a sync between its turns — waiting on its tool
                      "async_training.partial_rollout=false",
                      preset=TOOLS)
    assert run(resolve_plan(cfg), progress=False) == 0

    recs = train_records(run_dir)
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    uids = [e["uid"] for e in ledger]
    assert len(uids) == len(set(uids)) == PROMPTS  # every prompt accounted for exactly once
    status = collections.Counter(e["status"] for e in ledger)
    assert set(status) <= {"trained", "dropped"} and status["trained"] >= 16 * (len(recs) - 1)
    assert {e.get("reason") for e in ledger if e["status"] == "dropped"} <= {"aborted_at_sync"}

    total = collections.Counter()
    for r in recs:
        for key in ("asyncrl/tools/calls", "asyncrl/tools/errors", "asyncrl/tools/status/timeout",
                    "asyncrl/tools/status/error", "asyncrl/tools/status/limit", "asyncrl/tools/status/refused",
                    "fully_async/partial/total_partial_num", "asyncrl/tools/masked_tokens"):
            total[key] += r.get(key, 0)
    # timeouts come only from the sleeping rows; `error` counts the raising rows' calls and, with the `bare`
    # format, the untrained model's turns that begin with another word (an unknown tool)
    assert total["asyncrl/tools/status/timeout"] > 0 and total["asyncrl/tools/status/error"] > 0
    assert total["asyncrl/tools/errors"] == sum(total[f"asyncrl/tools/status/{s}"]
                                                for s in ("timeout", "error", "limit", "refused"))
    assert total["asyncrl/tools/status/refused"] == 0  # every call ran in its box
    assert total["asyncrl/tools/calls"] > total["asyncrl/tools/errors"]  # the slow ones answered
    assert total["asyncrl/tools/masked_tokens"] > 0  # trained trajectories carry their tools' answers
    # trajectories that waited on a tool through a sync were not aborted: their next turn ran on the new weights
    assert total["fully_async/partial/total_partial_num"] > 0
    assert max(r["asyncrl/tools/latency_s/max"] for r in recs if "asyncrl/tools/latency_s/max" in r) < TIMEOUT_S + 5
