"""`rollout.weight_sync = "collective"` in a real run: trainer rank 0 broadcasts each version over gloo to two
`hf` replicas (group ranks 1, 2), and the replicas generate with exactly the trained weights; the default
("auto": shared memory on one CPU host) does the same through /dev/shm — here into the replicas' back buffers
while they generate, swapped in at the pause — and leaves no file there."""

from __future__ import annotations

import math

import pytest
from run_helpers import read_jsonl, tiny_config, train_records

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize(("choice", "transport", "back_buffer"),
                         [("collective", "CollectiveSync", "off"), ("auto", "SharedMemorySync", "on")])
def test_collective_sync_gives_both_replicas_the_trained_weights(run_dir, choice, transport, back_buffer):
    import os

    # sync mode makes the check exact: each version's first step trains on rollouts of the weights just broadcast
    # (with the back buffer: received while generating, swapped in at the pause)
    cfg = tiny_config(run_dir, f'rollout.weight_sync="{choice}"', "rollout.max_replica_restarts=0",
                      f'rollout.weight_sync_back_buffer="{back_buffer}"',
                      "resources.rollout.gpus_per_node=2", "trainer.ppo_mini_batch_size=8", "rollout.n=4",
                      "trainer.ppo_micro_batch_size_per_gpu=32", "trainer.test_freq=0", 'async_training.mode="sync"',
                      "async_training.trigger_parameter_sync_step=2", "rollout.total_rollout_steps=48")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 7))
    assert [r["fully_async/count/current_param_version"] for r in recs] == [0, 1, 1, 2, 2, 3]
    synced = [r for r in recs if "asyncrl/sync/bytes" in r]
    assert len(synced) == 3 and all(r["asyncrl/sync/bytes"] > 1e5 for r in synced)
    firsts = [r for r in recs if r["training/global_step"] % 2 == 1 and "actor/pg_loss" in r]
    assert firsts and all(abs(r["rollout_corr/kl"]) < 1e-4 and math.isfinite(r["actor/pg_loss"]) for r in firsts)
    syncs = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync"]
    assert [e["step"] for e in syncs] == [2, 4, 6]
    # the delivery check's own numbers: both replicas reported every bucket, equal to what was sent, with effect
    assert all(e["verified"] == 1.0 and e["replicas_verified"] == 2 and e["transport"] == transport for e in syncs)
    assert all(r["asyncrl/sync/verified"] == 1.0 for r in synced)
    assert all(r["asyncrl/sync/staged"] == (back_buffer == "on") for r in synced)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"asyncrl-{run_dir.name}-")]


def test_auto_is_the_default_shared_memory_on_one_cpu_host_collective_with_vllm(tmp_path):
    from run_helpers import TINY

    from asyncrl_cli.config.loader import analyze_run_config
    from engine.plan.devices import weight_sync_transport

    an = analyze_run_config(TINY, [])
    assert an.config.rollout.weight_sync == "auto" and an.config.rollout.max_replica_restarts > 0
    assert weight_sync_transport(an.config, "cpu") == "shared_memory"
    assert weight_sync_transport(an.config, "cuda") == "collective"
    vllm = analyze_run_config(TINY, ['rollout.backend="vllm"']).config
    assert weight_sync_transport(vllm, "cpu") == "collective"
    with pytest.raises(ValueError, match='weight_sync_back_buffer = "on" needs rollout.backend = "hf"'):
        weight_sync_transport(analyze_run_config(TINY, ['rollout.backend="vllm"',
                                                        'rollout.weight_sync_back_buffer="on"']).config, "cpu")
    with pytest.raises(ValueError, match="needs device cpu"):
        weight_sync_transport(analyze_run_config(TINY, ['rollout.weight_sync="shared_memory"']).config, "cuda")
    assert not [p for p in an.problems if p.severity == "error"]
    an = analyze_run_config(TINY, ['rollout.backend="vllm"'])
    assert not [p for p in an.problems if p.code.startswith("collective-sync")]  # vLLM workers receive it too
