"""The whole loop in one process, without Ray: the real replica shell (the `hf` engine on the tiny model), the real
rollouter and trainer shells, the real queue and `ControllerCore`, wired by the in-process peers
(`engine.runtime.peers_local`). The trainer pulls groups the replica generated and the shell scored, trains, and
each sync's weights travel through the in-process object store into the replica, whose receipts pass the
trainer's delivery check."""

from __future__ import annotations

import json
import threading

from engine.control.core import ControllerCore
from engine.runtime.peers_local import LocalQueue, rollout_peers, trainer_peers

STEPS, PROMPTS, N = 2, 2, 2  # local steps, prompts per step, answers per prompt


def test_the_trainer_trains_on_what_the_replica_generated_and_syncs_it(tiny_roles, tmp_path, torch_threads) -> None:
    from engine.runtime.replica import ReplicaShell
    from engine.runtime.rollouter import RolloutShell
    from engine.runtime.trainer_actor import TrainerCore

    cfg, roles = tiny_roles(f"rollout.total_rollout_steps={STEPS * PROMPTS}", f"rollout.n={N}",
                            'rollout.weight_sync="object_store"', f"trainer.ppo_mini_batch_size={PROMPTS}",
                            "trainer.ppo_micro_batch_size_per_gpu=4", "trainer.test_freq=0",
                            "trainer.val_before_train=false", "async_training.trigger_parameter_sync_step=1",
                            "checkpoint.every_versions=0")
    core = ControllerCore(cfg.name, run_dir=str(tmp_path / "run"), sinks=[], config=cfg.model_dump())
    queue = LocalQueue(1)
    replica = ReplicaShell(roles.rollout.replica, 0)
    rpeers = rollout_peers(queue, core, [replica])
    rollouter = RolloutShell(roles.rollout, rpeers)
    thread = threading.Thread(target=rollouter.fit, daemon=True)
    thread.start()
    try:
        trainer = TrainerCore(roles.trainer, trainer_peers(queue, rollouter, rpeers.controller))
        out = trainer.fit()
    finally:
        rollouter.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert (out["local_step"], out["version"], out["stopped"]) == (STEPS, STEPS, None)
    assert rollouter.loop.version == STEPS  # the rollout side runs the last version's weights
    snap = core.snapshot()
    syncs = [e for e in snap["events"] if e["kind"] == "sync"]
    assert [e["replicas_verified"] for e in syncs] == [1] * STEPS  # the replica's receipts matched what was sent
    assert all(e["transport"] == "ObjectStoreSync" and e["bytes"] > 0 for e in syncs)
    records = [r for r in snap["metrics"] if "training/global_step" in r]
    assert [r["training/global_step"] for r in records] == list(range(1, STEPS + 1))
    assert records[-1]["fully_async/count/total_generated_samples"] >= STEPS * PROMPTS  # the rollouter's report
    ledger = [json.loads(x) for x in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    trained = [e["uid"] for e in ledger if e["status"] == "trained"]
    assert len(trained) == len(set(trained)) == STEPS * PROMPTS
    assert not any(e["level"] == "error" for e in snap["events"]), [e["message"] for e in snap["events"]]
