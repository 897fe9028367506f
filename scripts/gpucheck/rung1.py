"""Rung 1 of the device ladder: one accelerator, at most 10 minutes (`--cpu`: the same code on the CPU, seconds).

Each check returns its numbers; `proves` / `does_not_prove` (in `CHECKS`) say what a pass means.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gpucheck.models import build_model, load_spec, parameter_count, save_hf_dir
from gpucheck.report import peak_gib_and_reset

REPO = Path(__file__).resolve().parents[2]

CHECKS: dict[str, dict[str, str]] = {
    "device_detection": {
        "proves": "a worker whose CUDA_VISIBLE_DEVICES Ray blanked fails with one clear line (it no longer configures "
                  "vLLM as a CPU engine), and the plan gives a TP > 1 replica Ray's no-set override",
        "does_not_prove": "what Ray itself does with visible devices inside a placement group (rungs 2 and 8)",
    },
    "fsdp2_world1": {
        "proves": "the real FSDP2 backend joins its process group as the plan's device spec (cpu:gloo,cuda:nccl), "
                  "reduces its metrics on the device, trains a real-width slice of the 7B preset; peak memory "
                  "against the static memory model (weights + grads + fp32 Adam)",
        "does_not_prove": "collectives between ranks (world 1 has no peer: rung 2), activation memory at full depth; "
                          "recompute and token budgets are not trainer options yet (recorded as not measured)",
    },
    "precision_update_fraction": {
        "proves": "the share of parameter elements one optimizer step actually changes under the trainer's precision "
                  "(bf16 on an accelerator): a fraction near 0 means updates vanish in rounding",
        "does_not_prove": "learning over many steps",
    },
    "weight_sync_vllm": {
        "proves": "export from the FSDP2 backend → vLLM engine on the same device → greedy tokens equal the "
                  "trainer model's greedy tokens (the weight-sync pipeline, vLLM's engine arguments for the device)",
        "does_not_prove": "the collective (NCCL) transport between processes (rung 2); skipped when vLLM is not "
                          "importable",
    },
}


def _device_detection(smoke: bool) -> dict[str, Any]:
    code = ("from engine.runtime.backends import check_device\n"
            "try:\n    check_device('cuda')\n    print('VISIBLE')\n"
            "except RuntimeError as e:\n    print('REFUSED', e)\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
    if not line.startswith("REFUSED"):
        raise AssertionError(f"with CUDA_VISIBLE_DEVICES blank the worker did not refuse: {line}")
    from engine.plan.devices import RAY_NOSET_ENV, actor_env, role_devices

    role = role_devices("cuda", 2)["rollout"]
    env_vars = actor_env(role)
    if env_vars.get(RAY_NOSET_ENV["cuda"]) != "1":
        raise AssertionError(f"a TP 2 replica's runtime env lacks {RAY_NOSET_ENV['cuda']}: {env_vars}")
    return {"blank_visible_devices": line, "tp2_replica_env": env_vars}


def _random_batch(spec: Any, rows: int, prompt_len: int, resp_len: int, seed: int) -> Any:
    from gpucheck.batches import train_batch

    from engine.types import Prompt, Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(rows // 2):
        prompt = torch.randint(0, spec.vocab_size - 2, (prompt_len,), generator=g).tolist()
        trajs = [Trajectory(torch.randint(0, spec.vocab_size - 2, (resp_len,), generator=g).tolist(),
                            [-1.0] * resp_len, "length", 0, 0, reward=float(k)) for k in range(2)]
        groups.append(TrajectoryGroup(Prompt(f"0:{i}", i, 0, prompt), trajs))
    return train_batch(groups, pad_id=spec.eos_id)


def _fsdp(smoke: bool, device: str, state: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from engine.algo.loss import GRPOLoss
    from engine.plan.devices import RoleDevice
    from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed
    from engine.trainer.process_groups import group_backend

    spec = load_spec("qwen2.5-7b", smoke)
    if not smoke:
        spec.config.update({"num_hidden_layers": 2, "max_window_layers": 2})  # real width, two layers
    dtype = torch.float32 if smoke else torch.bfloat16
    role = RoleDevice(device, "local_rank" if device != "cpu" else "none")  # type: ignore[arg-type]
    rendezvous = Path(tempfile.mkdtemp()) / "rendezvous"
    init_distributed(0, 1, 0, device=role, init_method=f"file://{rendezvous}")
    model = build_model(spec, "cpu", dtype, seed=0)
    params = parameter_count(model)
    peak_gib_and_reset()
    trainer = FSDPTrainerBackend(model, optim_cfg={"lr": 1e-5}, grad_clip=1.0, micro_batch_size=2,
                                 device=role.type, precision="fp32" if smoke else "bf16")
    batch = _random_batch(spec, rows=4, prompt_len=8 if smoke else 256, resp_len=8 if smoke else 256, seed=0)
    before = [p.detach().float().clone() for p in trainer._local_params()]
    t0 = time.monotonic()
    metrics = trainer.train_step(batch, GRPOLoss())
    step_s = time.monotonic() - t0
    after = trainer._local_params()
    changed = sum(int((a.float() != b).sum()) for a, b in zip(after, before))
    state["update_fraction"] = changed / max(1, sum(b.numel() for b in before))
    peak = peak_gib_and_reset()
    weight_bytes = torch.tensor([], dtype=dtype).element_size()
    model_gib = params * (2 * weight_bytes + 8) / 2**30  # weights + grads + two fp32 Adam moments
    state.update(trainer=trainer, spec=spec, dtype=dtype)
    return {"process_group": group_backend(), "world": dist.get_world_size(), "params": params,
            "step_s": round(step_s, 3), "loss": metrics.get("actor/pg_loss"),
            "peak_gib": peak, "memory_model_gib": round(model_gib, 3),
            "recompute": "not measured: the torch trainer has no activation-recompute option yet",
            "token_budgets": "not measured: the torch trainer has no token-budget micro-batching yet"}


def _vllm_sync(smoke: bool, device: str, state: dict[str, Any]) -> dict[str, Any]:
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return {"skipped": f"vLLM is not importable here ({e})"}
    from engine.rollout.base import SamplingParams
    from engine.rollout.vllm.backend import VLLMRolloutBackend
    from engine.types import GenRequest

    trainer, spec = state["trainer"], state["spec"]
    hf_dir = save_hf_dir(build_model(spec, "cpu", state["dtype"], seed=1), Path(tempfile.mkdtemp()) / "hf")
    with VLLMRolloutBackend(hf_dir, device=device, dtype=str(state["dtype"]).removeprefix("torch."),
                            max_model_len=256, max_num_seqs=4, kv_cache_gib=0.25,
                            gpu_memory_utilization=0.3) as engine:
        engine.update_weights(trainer.export_weights(64 << 20), version=1)
        prompt = list(range(1, 9))
        (res,) = engine.generate([GenRequest("sync-0", prompt, max_new_tokens=8)], SamplingParams(temperature=0.0))
        ids = torch.tensor([prompt])
        model = trainer.model
        with torch.no_grad():
            want = []
            for _ in range(len(res.response_ids)):
                nxt = int(model(ids.to(trainer.device)).logits[0, -1].argmax())
                want.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        if res.response_ids != want:
            raise AssertionError(f"vLLM greedy {res.response_ids} != trainer greedy {want} after the sync")
        return {"tokens": res.response_ids, "engine_features": vars(engine.features)}


def run(report: Any, device: str, smoke: bool) -> None:
    """Run rung 1's checks in order into `report` (`gpucheck.report.Report`)."""
    state: dict[str, Any] = {}

    def with_meta(name: str, fn: Any) -> None:
        report.run(name, fn)
        section = report.data["sections"][name]
        section.update(CHECKS[name])
        if "skipped" in section:
            section["status"] = "skipped"
        report.write()

    with_meta("device_detection", lambda: _device_detection(smoke))
    with_meta("fsdp2_world1", lambda: _fsdp(smoke, device, state))
    with_meta("precision_update_fraction", lambda: _fraction(state))
    if "trainer" in state:
        with_meta("weight_sync_vllm", lambda: _vllm_sync(smoke, device, state))


def _fraction(state: dict[str, Any]) -> dict[str, Any]:
    if "update_fraction" not in state:
        raise RuntimeError("fsdp2_world1 did not run")
    return {"update_fraction": round(state["update_fraction"], 6)}
