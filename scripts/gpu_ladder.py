"""The device ladder: the one entry point for accelerator checks, one command per rung, each writing ONE JSON report.

    python scripts/gpu_ladder.py --list                        # the rungs, what each proves and does not
    python scripts/gpu_ladder.py --smoke                       # CPU, seconds: every rung's command lines built and
                                                               # their run files validated + launch --dry-run (CI)
    python scripts/gpu_ladder.py --rung 1 --out r1.json        # 1 GPU, ≤ 10 min
    python scripts/gpu_ladder.py --rung 1 --cpu --out r1.json  # rung 1's checks on the CPU (the slow suite runs it)
    python scripts/gpu_ladder.py --rung bench --out b.json     # 1 GPU: the backends' throughput study (gpu_check.py)
    python scripts/gpu_ladder.py --rung 2 --out r2.json        # 2 GPUs
    python scripts/gpu_ladder.py --rung 8 --out r8.json        # one 8-GPU node (seed 000's path, 4-layer 30B-A3B)
    python scripts/gpu_ladder.py --rung ascend --out ra.json   # one 8-NPU Ascend node (seed 002's path)

Rung 1 runs in this process (`gpucheck.rung1`), then the runtime placement check (`gpu_runtime_check.py`). The
other rungs are lists of checks (`RUNGS`): a command (the project's own device tests, a script), or a `launch` of
a run file under `scripts/ladder/` — valid presets (`asyncrl validate` passes them, memory model included),
sized to the rung's devices: rung 8 is seed 000's configuration on a layer-truncated Qwen3-30B-A3B-Base (the
first 4 of its 48 layers, same widths and experts: written first from the real checkpoint by
`gpucheck.truncate`), ascend is seed 002's on one 8-NPU node (4 trainer + 4 rollout NPUs). Each launch
checkpoints every version and is followed by a `--resume auto` launch with one more step. A rung needs its
accelerator count and says so (status "skipped") when the machine has fewer. Every check carries `proves` and
`does_not_prove`. Exit status 0 only when no check failed.

Carried wheels: a device machine has no registry access; wheels in `.whl/` (megatron-core for its Python) are
installed into a private target directory first and put on the checks' PYTHONPATH (vLLM is too large to carry;
the bench rung reports it as not measurable).

`--smoke` is what keeps the ladder from rotting while no accelerator is lent: it builds every rung's command
lines, checks that the test files and scripts they name exist, that rung 8's shipped config.json is the real
model's truncated by `gpucheck.truncate`, and runs `asyncrl validate` and `asyncrl launch --dry-run` (no Ray, no
model) on every launch check's exact arguments. The default test suite runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

PY = sys.executable
LADDER = REPO / "scripts" / "ladder"
MOE_4L = LADDER / "Qwen3-30B-A3B-Base-4L"
RUNG_8 = LADDER / "rung8-qwen3-30b-a3b-4l.toml"
RUNG_ASCEND = LADDER / "rung-ascend-qwen3-vl-8b.toml"
MOE_ENV = "ASYNCRL_LADDER_MOE_PATH"


def launch(run_file: Path, name: str, proves: str, does_not_prove: str, timeout_s: int) -> list[dict[str, Any]]:
    """A launch check of `run_file` and its resume check (`--resume auto`, one more step)."""
    rel = str(run_file.relative_to(REPO))
    steps = "trainer.total_steps=3"
    return [
        {"name": name, "launch": [rel], "timeout_s": timeout_s, "proves": proves, "does_not_prove": does_not_prove},
        {"name": f"{name}_resume", "launch": [rel, "--set", steps, "--resume", "auto"], "timeout_s": 900,
         "refuse": "no checkpoint to resume from",
         "proves": "resume from the checkpoint the previous check wrote (weights, optimizer, queue), one more step",
         "does_not_prove": "a crash mid-sync; resume across a different layout"},
    ]


RUNGS: dict[str, dict[str, Any]] = {
    "1": {"devices": 1, "budget_s": 600, "checks": [
        {"name": "rung1", "python": "gpucheck.rung1", "proves": "see gpucheck.rung1.CHECKS",
         "does_not_prove": "see gpucheck.rung1.CHECKS", "timeout_s": 480},
        {"name": "runtime_placement", "cmd": [PY, "scripts/gpu_runtime_check.py", "h100"], "cpu_arg": "cpu",
         "timeout_s": 300,
         "proves": "the runtime's own hf replica and torch trainer, built from a CUDA hardware preset as the actors "
                   "build them, compute on the GPU, agree on log-probs, train and sync",
         "does_not_prove": "Ray placement; vLLM; more than one device"},
    ]},
    "bench": {"devices": 1, "budget_s": 600, "checks": [
        {"name": "backend_study", "cmd": [PY, "scripts/gpu_check.py"], "out_arg": "--out", "cpu_arg": "--cpu-smoke",
         "timeout_s": 560,
         "proves": "hf generation, torch / Megatron train-step times, bucket export and NCCL weight transfer of "
                   "the 0.6B and 7B at real sizes (random weights from shipped configs), a 20-step async loop",
         "does_not_prove": "vLLM (not carried); Megatron at 7B (does not fit one GPU); anything multi-device"},
    ]},
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
    "8": {"devices": 8, "budget_s": 2400, "prepare": "truncate_moe", "checks": [
        *launch(RUNG_8, "seed000_4l_full_driver",
                "seed 000's path on one node: Megatron tp 2 / cp 2 (Transformer Engine attention) / ep 4 with the "
                "decoupled π_prox, a vLLM TP 4 replica on placement-group bundles, two NCCL syncs, a checkpoint "
                "per version", "multi-node (the 97-rank NCCL group); the full 48 layers; learning. Needs the "
                "Qwen3-30B-A3B-Base checkpoint (${QWEN3_30B_A3B_BASE_PATH}) and the DAPO-Math parquet files", 1500),
    ]},
    "ascend": {"devices": 8, "device": "npu", "budget_s": 2400, "checks": [
        *launch(RUNG_ASCEND, "seed002_one_node",
                "seed 002's path on one Ascend node: FSDP2 over cpu:gloo,npu:hccl (float32 reductions on the NPU), "
                "vLLM-Ascend engine arguments for npu, two HCCL weight syncs into 4 replicas, a checkpoint per "
                "version", "multi-node HCCL; vLLM-Ascend's reload layout (NZ) beyond the delivery check; Megatron "
                "on NPU (not supported). Needs Qwen3-VL-8B-Instruct and the geo3k parquet files", 1500),
    ]},
}


def command_of(check: dict[str, Any], out_dir: Path, cpu: bool = False, dry_run: bool = False) -> list[str]:
    """The command line of a command or launch check (`dry_run`: the launch with `--dry-run`, resume dropped)."""
    if "launch" in check:
        args = list(check["launch"])
        if dry_run:
            args = args[:args.index("--resume")] if "--resume" in args else args
            args.append("--dry-run")
        return [PY, "-m", "asyncrl_cli", "launch", *args]
    cmd = list(check["cmd"])
    if cpu and "cpu_arg" in check:
        cmd = [*cmd[:2], check["cpu_arg"]] if check["cpu_arg"] == "cpu" else [*cmd, check["cpu_arg"]]
    if "out_arg" in check:
        cmd += [check["out_arg"], str(out_dir / f"{check['name']}.json")]
    return cmd


def carried_wheels() -> str:
    """Install `.whl/*.whl` (if any) into a private directory; its path for PYTHONPATH ("" when none)."""
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not wheels:
        return ""
    site = tempfile.mkdtemp(prefix="ladder_site.")
    r = subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", site, *map(str, wheels)], capture_output=True)
    return site if r.returncode == 0 else ""


def check_env(extra: dict[str, str], site: str = "") -> dict[str, str]:
    path = os.pathsep.join(p for p in (site, str(REPO), str(REPO / "scripts")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
            **extra}


def truncate_moe(report: Any) -> dict[str, str]:
    """Rung 8's preparation: the 4-layer copy of Qwen3-30B-A3B-Base; the environment that points the run at it."""
    from gpucheck.truncate import truncate_checkpoint

    from engine.models.loader import resolve_model_path

    dst = Path(os.environ.get(MOE_ENV) or Path(tempfile.gettempdir()) / "asyncrl-ladder" / MOE_4L.name)
    layers = int(json.loads((MOE_4L / "config.json").read_text())["num_hidden_layers"])

    def prepare() -> dict[str, Any]:
        src = resolve_model_path(os.environ.get("QWEN3_30B_A3B_BASE_PATH", "Qwen/Qwen3-30B-A3B-Base"))
        return truncate_checkpoint(src, dst, layers)

    report.run("prepare_truncated_moe", prepare, need_s=60.0)
    return {MOE_ENV: str(dst)}


def run_checks(report: Any, rung: dict[str, Any], device: str, cpu: bool, out_dir: Path) -> None:
    site = "" if cpu else carried_wheels()
    env: dict[str, str] = {}
    if rung.get("prepare") == "truncate_moe":
        env.update(truncate_moe(report))
    for check in rung["checks"]:
        if "python" in check:
            from gpucheck import rung1

            rung1.run(report, device, smoke=cpu)
            continue
        cmd = command_of(check, out_dir, cpu)

        def one(check: dict[str, Any] = check, cmd: list[str] = cmd) -> dict[str, Any]:
            t0 = time.monotonic()
            out = subprocess.run(cmd, cwd=REPO, env=check_env({**env, **check.get("env", {})}, site),
                                 capture_output=True, text=True, timeout=check["timeout_s"])
            tail = (out.stdout + out.stderr)[-3000:]
            result = {"rc": out.returncode, "wall_s": round(time.monotonic() - t0, 1), "tail": tail}
            if out.returncode or (check.get("refuse") and check["refuse"] in out.stdout + out.stderr):
                raise RuntimeError(f"exit {out.returncode}: {tail[-800:]}")
            return result

        report.run(check["name"], one, need_s=min(60.0, check["timeout_s"]))
        report.data["sections"][check["name"]].update(
            {"command": " ".join(cmd), "proves": check["proves"], "does_not_prove": check["does_not_prove"]})
        report.write()


def smoke(names: list[str]) -> dict[str, Any]:
    """Every rung's command lines built and checked on the CPU (module docstring); {rung: {check: result}}."""
    from gpucheck.truncate import truncated_config

    out: dict[str, Any] = {}
    known = json.loads((REPO / "asyncrl_cli/config/known_models/Qwen--Qwen3-30B-A3B-Base.json").read_text())
    shipped = json.loads((MOE_4L / "config.json").read_text())
    out["truncated_moe_config"] = truncated_config(known, shipped["num_hidden_layers"]) == shipped
    for name in names:
        res: dict[str, Any] = {}
        for check in RUNGS[name]["checks"]:
            if "python" in check:
                res[check["name"]] = {"ok": True, "module": check["python"]}
                continue
            cmd = command_of(check, Path(tempfile.gettempdir()))
            if "launch" not in check:
                paths = [a for a in cmd[1:] if a.endswith((".py", ".sh")) or a.startswith("tests/")]
                missing = [p for p in paths if not (REPO / p).exists()]
                res[check["name"]] = {"ok": not missing, "command": cmd, "missing": missing}
                continue
            run_file, rest = check["launch"][0], check["launch"][1:]
            sets = [a for i in range(len(rest) - 1) if rest[i] == "--set" for a in rest[i:i + 2]]
            runs = {"validate": [PY, "-m", "asyncrl_cli", "validate", run_file, *sets],
                    "dry_run": command_of(check, Path(tempfile.gettempdir()), dry_run=True)}
            got = {}
            for what, c in runs.items():
                r = subprocess.run(c, cwd=REPO, env=check_env({"COLUMNS": "200"}), capture_output=True, text=True,
                                   timeout=120)
                got[what] = {"rc": r.returncode, "tail": (r.stdout + r.stderr)[-1500:]}
            res[check["name"]] = {"ok": all(g["rc"] == 0 for g in got.values()), "command": cmd, **got}
        out[name] = res
    return out


def visible_accelerators(kind: str) -> int:
    try:
        import torch

        if kind == "npu":
            import torch_npu  # noqa: F401

        return int(getattr(torch, kind).device_count())
    except Exception:  # noqa: BLE001 — no accelerator stack: zero devices
        return 0


def listing() -> dict[str, Any]:
    from gpucheck.rung1 import CHECKS

    def checks(rung: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = {}
        for c in rung["checks"]:
            if "python" in c:
                got.update(CHECKS)
            else:
                got[c["name"]] = {"proves": c["proves"], "does_not_prove": c["does_not_prove"],
                                  "command": " ".join(command_of(c, Path("$OUT")))}
        return got

    return {name: {**{k: v for k, v in rung.items() if k != "checks"}, "checks": checks(rung)}
            for name, rung in RUNGS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rung", choices=sorted(RUNGS))
    ap.add_argument("--cpu", action="store_true", help="rungs 1 and bench on the CPU (same code, tiny models)")
    ap.add_argument("--smoke", action="store_true", help="CPU: build and validate every rung's commands (CI)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")) / "ladder.json")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        result = smoke([args.rung] if args.rung else sorted(RUNGS))
        ok = result["truncated_moe_config"] and all(c["ok"] for r in result.values() if isinstance(r, dict)
                                                     for c in r.values())
        print(json.dumps({"ok": ok, **result}, indent=2))
        return 0 if ok else 1
    if args.list or not args.rung:
        print(json.dumps(listing(), indent=2))
        return 0
    from gpucheck.report import Report, environment

    rung = RUNGS[args.rung]
    kind = rung.get("device", "cuda")
    if args.cpu and args.rung not in ("1", "bench"):
        ap.error("--cpu runs rungs 1 and bench only (the others: --smoke)")
    device = "cpu" if args.cpu else kind
    report = Report(args.out, rung["budget_s"], {"rung": args.rung, "device": device, "cpu_smoke": args.cpu})
    report.set("environment", environment())
    found = visible_accelerators(kind)
    if not args.cpu and found < rung["devices"]:
        report.set("skipped", f"rung {args.rung} needs {rung['devices']} {kind} devices; this machine has {found}")
        print(json.dumps(report.finish(), indent=2))
        return 2
    run_checks(report, rung, device, args.cpu, args.out.parent)
    data = report.finish()
    failed = [n for n, s in data["sections"].items() if s.get("status") == "error"]
    report.set("ok", not failed)
    print(json.dumps({"ok": not failed, "failed": failed, "report": str(args.out)}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
