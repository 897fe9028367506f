"""The device ladder: prepared checks, one command per rung, each writing ONE JSON report.

    python scripts/gpu_ladder.py --list                       # the rungs, what each proves and does not
    python scripts/gpu_ladder.py --rung 1 --out r1.json       # 1 GPU, ≤ 10 min
    python scripts/gpu_ladder.py --rung 1 --cpu --out r1.json # the same code on the CPU (the slow suite runs it)
    python scripts/gpu_ladder.py --rung 2 --out r2.json       # 2 GPUs
    python scripts/gpu_ladder.py --rung 8 --out r8.json       # 8 GPUs
    python scripts/gpu_ladder.py --rung ascend --out ra.json  # one Ascend node (8 NPUs)

Rung 1 runs in this process (`gpucheck.rung1`). Rungs 2, 8 and ascend are lists of commands (the project's own
GPU tests and driver runs, `RUNGS` below), each run with its time limit; a rung needs its accelerator count and
says so (status "skipped") when the machine has fewer. Every check in the report carries `proves` and
`does_not_prove`. Exit status 0 only when no check failed. Rungs 2, 8 and ascend have never run (no accelerator was
lent while they were written): their first run is their test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

PY = sys.executable
RUN_8 = [PY, "-m", "asyncrl_cli", "launch", "presets/runs/qwen3-30b-a3b-base-dapo-megatron-96-32.toml",
         "--set", "trainer.tp=2", "--set", "trainer.cp=2", "--set", "trainer.ep=2",
         "--set", "rollout.tensor_parallel_size=4", "--set", "resources.trainer.gpus_per_node=4",
         "--set", "resources.rollout.gpus_per_node=4", "--set", "trainer.total_steps=2",
         "--set", "async_training.trigger_parameter_sync_step=1", "--set", "trainer.save_freq=1"]

RUNGS: dict[str, dict[str, Any]] = {
    "1": {"devices": 1, "budget_s": 600, "checks": "gpucheck.rung1"},
    "2": {"devices": 2, "budget_s": 900, "checks": [
        {"name": "fsdp2_world1_nccl_tests", "cmd": [PY, "-m", "pytest", "-q", "-m", "gpu",
                                                     "tests/trainer/test_trainer_cuda.py", "tests/rollout/test_hf_cuda.py"],
         "timeout_s": 300,
         "proves": "the CUDA trainer and hf sampler tests (snapshot, export, checkpoint, FSDP2 over NCCL at world 1)",
         "does_not_prove": "two ranks"},
        {"name": "fsdp2_world2_nccl", "cmd": [PY, "-m", "pytest", "-q", "tests/trainer/test_fsdp_trainer.py",
                                              "-k", "nccl or cuda"], "timeout_s": 300,
         "proves": "FSDP2 across two GPUs over cpu:gloo,cuda:nccl: gradients equal one process on all rows",
         "does_not_prove": "Megatron; vLLM"},
        {"name": "megatron_tp2_ep2", "cmd": [PY, "-m", "pytest", "-q", "tests/megatron_trainer/test_megatron_tp2.py",
                                             "tests/megatron_trainer/test_megatron_ep2.py"], "timeout_s": 420,
         "proves": "Megatron TP 2 and EP 2 runs (the tests pick NCCL when the workers see CUDA)",
         "does_not_prove": "CP (needs Transformer Engine); the full driver"},
        {"name": "nccl_weight_sync_into_vllm_tp1", "cmd": [PY, "-m", "pytest", "-q", "-m", "vllm",
                                                           "tests/vllm_rollout/test_vllm_collective_sync.py"],
         "timeout_s": 420, "env": {"ASYNCRL_TEST_DEVICE": "cuda"},
         "proves": "the collective weight sync into a real vLLM TP 1 worker",
         "does_not_prove": "TP > 1 replicas on placement-group bundles (rung 8)"},
    ]},
    "8": {"devices": 8, "budget_s": 1800, "checks": [
        {"name": "qwen3_30b_a3b_full_driver", "cmd": RUN_8, "timeout_s": 1500,
         "proves": "the full driver on 8 GPUs: Megatron tp 2 / cp 2 / ep 2, a vLLM TP 4 replica on placement-group "
                   "bundles (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), two syncs, a checkpoint",
         "does_not_prove": "multi-node; learning. Needs the Qwen3-30B-A3B weights on the node"},
        {"name": "resume", "cmd": [*RUN_8, "--resume"], "timeout_s": 600,
         "proves": "resume from the checkpoint the previous check wrote", "does_not_prove": "a crash mid-sync"},
    ]},
    "ascend": {"devices": 8, "device": "npu", "budget_s": 1800, "checks": [
        {"name": "qwen3_vl_8b_fsdp2_npu", "cmd": [PY, "-m", "asyncrl_cli", "launch",
                                                  "presets/runs/qwen3-vl-8b-geo3k-fsdp2-npu-2x8.toml",
                                                  "--set", "resources.trainer.nnodes=1",
                                                  "--set", "resources.rollout.nnodes=1",
                                                  "--set", "trainer.total_steps=2",
                                                  "--set", "trainer.save_freq=1"], "timeout_s": 1500,
         "proves": "FSDP2 over cpu:gloo,npu:hccl (float32 reductions on the NPU), vLLM-Ascend engine arguments "
                   "for npu, two syncs and a checkpoint on one Ascend node",
         "does_not_prove": "multi-node HCCL; Megatron on NPU (not supported)"},
    ]},
}


def visible_accelerators(kind: str) -> int:
    try:
        import torch

        if kind == "npu":
            import torch_npu  # noqa: F401

        return int(getattr(torch, kind).device_count())
    except Exception:  # noqa: BLE001 — no accelerator stack: zero devices
        return 0


def run_commands(report: Any, checks: list[dict[str, Any]]) -> None:
    for check in checks:
        def one(check: dict[str, Any] = check) -> dict[str, Any]:
            env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'scripts'}", **check.get("env", {})}
            t0 = time.monotonic()
            out = subprocess.run(check["cmd"], cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=check["timeout_s"])
            result = {"rc": out.returncode, "wall_s": round(time.monotonic() - t0, 1),
                      "tail": (out.stdout + out.stderr)[-3000:]}
            if out.returncode:
                raise RuntimeError(f"exit {out.returncode}: {result['tail'][-800:]}")
            return result

        report.run(check["name"], one, need_s=min(60.0, check["timeout_s"]))
        report.data["sections"][check["name"]].update(
            {"command": " ".join(check["cmd"]), "proves": check["proves"], "does_not_prove": check["does_not_prove"]})
        report.write()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rung", choices=sorted(RUNGS))
    ap.add_argument("--cpu", action="store_true", help="rung 1 on the CPU (smoke mode: same code, tiny model)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")) / "ladder.json")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list or not args.rung:
        from gpucheck.rung1 import CHECKS

        listing = {name: {**{k: v for k, v in rung.items() if k != "checks"},
                          "checks": CHECKS if name == "1" else {c["name"]: {"proves": c["proves"],
                                                                           "does_not_prove": c["does_not_prove"]}
                                                                for c in rung["checks"]}}
                   for name, rung in RUNGS.items()}
        print(json.dumps(listing, indent=2))
        return 0
    from gpucheck.report import Report, environment

    rung = RUNGS[args.rung]
    kind = rung.get("device", "cuda")
    if args.cpu and args.rung != "1":
        ap.error("--cpu runs rung 1 only")
    device = "cpu" if args.cpu else kind
    report = Report(args.out, rung["budget_s"], {"rung": args.rung, "device": device, "cpu_smoke": args.cpu})
    report.set("environment", environment())
    found = visible_accelerators(kind)
    if not args.cpu and found < rung["devices"]:
        report.set("skipped", f"rung {args.rung} needs {rung['devices']} {kind} devices; this machine has {found}")
        print(json.dumps(report.finish(), indent=2))
        return 2
    if args.rung == "1":
        from gpucheck import rung1

        rung1.run(report, device, smoke=args.cpu)
    else:
        run_commands(report, rung["checks"])
    data = report.finish()
    failed = [n for n, s in data["sections"].items() if s.get("status") == "error"]
    data["ok"] = not failed
    report.set("ok", not failed)
    print(json.dumps({"ok": not failed, "failed": failed, "report": str(args.out)}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
