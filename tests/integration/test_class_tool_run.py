"""A multi-turn run on a real local Ray whose tool is a verl-style class of the user's (a YAML `class_name`):
each trajectory's calls go to its own long-lived box (`create` with the row's `tools_kwargs.lookup.create_kwargs`),
the run trains, every call ran boxed, and when the run is over no box of the tool is left."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from engine.agent.box import unavailable_reason
from engine.plan.run_plan import resolve_plan
from engine.runtime.driver import run
from run_helpers import REPO, read_jsonl, tiny_config, train_records

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(unavailable_reason() is not None, reason="no tool box here")]

TOOL = '''from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class SecretLookup(BaseTool):
    """The row's secret (given to `create`), once per trajectory; a second call is told it has it already."""

    async def create(self, instance_id=None, secret="", **kwargs):
        self.state = {"secret": secret, "calls": 0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        self.state["calls"] += 1
        return ToolResponse(text=self.state["secret"] if self.state["calls"] == 1 else "0"), 0.0, {}
'''
YAML = '''tools:
  - class_name: secret_lookup.SecretLookup
    config: {default_timeout: 10, memory_limit_mb: 512, trajectory_timeout_s: 120}
    tool_schema:
      type: function
      function: {name: lookup, description: Look up this problem's secret., parameters: {type: object, properties: {}}}
'''


def _boxes_of(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def test_a_class_tool_run_trains_with_one_box_per_trajectory_and_leaves_none(run_dir, tmp_path):
    (tmp_path / "secret_lookup.py").write_text(TOOL)
    (tmp_path / "tools.yaml").write_text(YAML)
    prompts = 48
    cfg = tiny_config(run_dir, "data.val_files=[]", "trainer.test_freq=0", "trainer.val_before_train=false",
                      "trainer.ppo_mini_batch_size=16", "trainer.ppo_micro_batch_size_per_gpu=32",
                      f"rollout.total_rollout_steps={prompts}", "trainer.total_epochs=1", "rollout.multi_turn.tools=[]",
                      f'rollout.multi_turn.tool_config_path="{tmp_path / "tools.yaml"}"',
                      preset=REPO / "presets" / "runs" / "tiny-tools-cpu.toml")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    status = collections.Counter(e["status"] for e in read_jsonl(run_dir / "ledger.jsonl"))
    assert status["trained"] >= 16 * (len(recs) - 1)
    total = collections.Counter()
    for r in recs:
        for key in ("asyncrl/tools/calls", "asyncrl/tools/errors", "asyncrl/tools/status/refused",
                    "asyncrl/tools/status/timeout", "asyncrl/tools/masked_tokens"):
            total[key] += r.get(key, 0)
    assert total["asyncrl/tools/calls"] > 0 and total["asyncrl/tools/masked_tokens"] > 0
    assert total["asyncrl/tools/status/refused"] == total["asyncrl/tools/status/timeout"] == 0
    assert all("asyncrl/tools/instances" in r for r in recs)
    end = time.monotonic() + 10
    while _boxes_of(str(tmp_path / "secret_lookup.py")) and time.monotonic() < end:
        time.sleep(0.2)
    assert _boxes_of(str(tmp_path / "secret_lookup.py")) == []  # no box outlived the run
