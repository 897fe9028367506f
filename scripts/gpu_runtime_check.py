"""GPU check of the runtime's device placement (one short run on a lent GPU; prints one JSON line).

The runtime builds its backends with `engine.runtime.backends`; with a CUDA hardware preset the `hf` rollout
replica and the `torch` trainer must compute on the GPU. This builds both exactly as the actors do, from the
tiny preset with `resources.hardware = "h200"`, then: generate a GRPO batch on the replica → one trainer step →
export (HF-named host buckets) → load into the replica → greedy outputs equal a fresh copy of the trained policy,
and the trainer's log-probs of the replica's tokens agree. Exit 0 only if every check holds.

    PYTHONPATH=.:scripts python scripts/gpu_runtime_check.py        # on the GPU machine
    PYTHONPATH=.:scripts python scripts/gpu_runtime_check.py cpu    # the same path on a CPU (tests the script)
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from gpucheck.batches import groups_from_results, random_prompts, requests_for, train_batch

from asyncrl_cli.config.loader import load_run_config
from engine.algo.loss import GRPOLoss
from engine.models.loader import resolve_model_path
from engine.rollout.base import SamplingParams
from engine.plan.run_plan import resolve_plan
from engine.runtime.backends import build_rollout_backend, build_trainer_backend

PRESET = Path("presets/runs/tiny-cpu.toml")


def main(hardware: str) -> int:
    t0 = time.monotonic()
    run_dir = tempfile.mkdtemp()
    res = load_run_config(PRESET, [f'resources.hardware="{hardware}"', f'logging.run_dir="{run_dir}"'])
    if res.config is None:
        print(json.dumps({"ok": False, "problems": [str(p) for p in res.problems]}))
        return 1
    cfg = res.config
    model_dir = str(resolve_model_path(cfg.model.path))
    plan = resolve_plan(cfg)
    devices, roles = plan.devices, plan.role_specs()  # each role's device and spec, as the driver hands them over
    trainer = build_trainer_backend(roles.trainer.backend, model_dir, device=devices["trainer"])
    replica = build_rollout_backend(roles.replica.engine, model_dir, devices["rollout"])
    report: dict = {"compute_device": devices["trainer"].type, "trainer_device": str(trainer.device),
                    "replica_devices": sorted({p.device.type for p in replica.model.parameters()})}
    vocab = int(trainer.model.config.vocab_size)
    prompts = random_prompts(8, 12, vocab, {*replica.eos_ids, replica.pad_token_id}, seed=0)
    sampling = SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, seed=0)
    results = replica.generate(requests_for(prompts, 4, 16, "gpu"), sampling)
    batch = train_batch(groups_from_results(prompts, 4, results), int(replica.pad_token_id))
    lp, _ = trainer.compute_log_probs(batch)
    mask = batch.response_mask.bool()
    report["logprob_max_abs_diff"] = float((lp - batch.rollout_log_probs)[mask].abs().max())
    metrics = trainer.train_step(batch, GRPOLoss())
    report["grad_norm"] = float(metrics["actor/grad_norm"])
    replica.update_weights(trainer.export_weights(1 << 22), version=1)
    report["synced_mb"] = round(replica.stats()["weight_update_bytes"] / 2**20, 2)
    greedy = SamplingParams(temperature=0.0)
    reqs = requests_for(prompts[:4], 1, 16, "greedy")
    after = [r.response_ids for r in replica.generate(reqs, greedy)]
    fresh = copy.deepcopy(trainer.model).eval()
    with torch.no_grad():
        same = all(torch.equal(a, b.to(a.device)) for a, b in zip(replica.model.state_dict().values(),
                                                                   fresh.state_dict().values()))
    report["replica_weights_equal_trainer"] = same
    report["greedy_tokens"] = sum(len(a) for a in after)
    want = "cuda" if hardware != "cpu" else "cpu"
    report["checks"] = {
        "trainer_on_device": trainer.device.type == want,
        "replica_on_device": report["replica_devices"] == [want],
        "logprobs_agree": report["logprob_max_abs_diff"] < 1e-3,
        "trained": report["grad_norm"] > 0,
        "weights_synced": same,
    }
    report["ok"] = all(report["checks"].values())
    report["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "h200"))
