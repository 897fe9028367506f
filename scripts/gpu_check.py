"""The GPU check: one run on one accelerator that measures the production paths at real model sizes and
writes ONE JSON report (also printed on stdout). Models are random-initialised from the shipped configs
(`gpucheck.models.MODELS`: Qwen3-0.6B and Qwen2.5-7B), so nothing is downloaded.

Sections (each recorded as ok / error / skipped, the file rewritten after each one):
  rollout_hf_<small|big>   `hf` backend generation tokens/s (bf16)
  trainer_torch_<small>    `TorchTrainerBackend` train-step time on the rollout's batch (GRPO loss), and
                           the host sync path (export to numpy buckets, load back)
  trainer_megatron_<small> `MegatronTrainerBackend` (TP=1) train-step time, proximal snapshot, bucket export
  weight_sync              two processes on the device: NCCL probe, then bucketed transfer of the 0.6B and 7B
  async_loop_<small>       a 20-step fully-async GRPO loop without Ray (rollout thread + trainer)
  trainer_torch_<big>      the torch trainer's step on the 7B (bf16 AdamW states fit one GPU)
  not_measured             vLLM (not installable there) and Megatron at 7B (does not fit one GPU), with why

Usage:  python scripts/gpu_check.py --out PATH [--cpu-smoke] [--budget-s S] [--dtype float32|bfloat16]
        [--only SECTION,...]
`--cpu-smoke` runs every section on the CPU with shrunken models (the same code paths, seconds).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import torch
from gpucheck import async_loop, trainer_bench, weight_sync
from gpucheck.batches import groups_from_results, train_batch
from gpucheck.models import build_model, load_spec, parameter_bytes, parameter_count, save_hf_dir
from gpucheck.report import Report, environment
from gpucheck.rollout_bench import hf_generation

VLLM_NOTE = "not measurable: not installable on the device (no registry access, wheel too large to carry)"
ADAM_BYTES_PER_PARAM = 18  # Megatron bf16: weight 2 + fp32 main grad 4 + fp32 master 4 + two fp32 moments 8


_SIZES: dict[str, tuple[Any, Any]] = {  # name: (CPU smoke run, GPU)
    "device": ("cpu", "cuda"),
    "dtype": ("float32", "bfloat16"),
    "rollout_small": ({"prompts": 2, "n": 2, "prompt_len": 8, "new_tokens": 6},
                      {"prompts": 16, "n": 4, "prompt_len": 256, "new_tokens": 256}),
    "rollout_big": ({"prompts": 2, "n": 2, "prompt_len": 8, "new_tokens": 4},
                    {"prompts": 16, "n": 4, "prompt_len": 256, "new_tokens": 128}),
    "train_small": ({"micro": 2, "steps": 2}, {"micro": 16, "steps": 3}),
    "train_big": ({"micro": 2, "steps": 2}, {"micro": 8, "steps": 3}),
    "bucket_bytes": (1 << 16, 512 << 20),
    "async": ({"steps": 3, "prompts": 2, "n": 2, "prompt_len": 6, "new_tokens": 4, "micro": 4},
              {"steps": 20, "prompts": 8, "n": 4, "prompt_len": 64, "new_tokens": 64, "micro": 32}),
    "sync_transports": (["gloo", "ipc"], ["nccl", "ipc"]),
}


def settings(smoke: bool) -> dict[str, Any]:
    """Sizes of every section: real sizes on a GPU, a few tokens on the CPU smoke run (same models, budget)."""
    column = 0 if smoke else 1
    return {"small": "qwen3-0.6b", "big": "qwen2.5-7b", "budget_s": 300,
            **{name: copy.deepcopy(sizes[column]) for name, sizes in _SIZES.items()}}


class Check:
    """The sections. A rollout section leaves its model, batch (rollout results + GRPO advantages) and HF
    directory behind for the trainer sections of the same size ("small" | "big")."""

    def __init__(self, cfg: dict[str, Any], report: Report, smoke: bool, workdir: Path) -> None:
        self.cfg, self.report, self.smoke, self.workdir = cfg, report, smoke, workdir
        self.device, self.dtype = cfg["device"], getattr(torch, cfg["dtype"])
        self.specs = {size: load_spec(cfg[size], smoke) for size in ("small", "big")}
        self.models: dict[str, torch.nn.Module] = {}
        self.batches: dict[str, Any] = {}
        self.hf_dirs: dict[str, Path] = {}

    def rollout(self, size: str) -> dict[str, Any]:
        spec, sizes = self.specs[size], self.cfg[f"rollout_{size}"]
        model = build_model(spec, self.device, self.dtype, seed=0)
        if size == "small":
            self.hf_dirs[size] = save_hf_dir(model, self.workdir / spec.name)
        metrics, prompts, results = hf_generation(model, spec, self.device, seed=0, **sizes)
        self.models[size] = model
        self.batches[size] = train_batch(groups_from_results(prompts, sizes["n"], results), spec.eos_id)
        return {
            "model": spec.name,
            "params": parameter_count(model),
            "weights_gib": round(parameter_bytes(model) / 2**30, 2),
            **metrics,
        }

    def trainer_torch(self, size: str) -> dict[str, Any]:
        if size not in self.models:
            raise RuntimeError(f"needs the rollout section's {size} model and batch")
        model = self.models.pop(size)
        return {
            "model": self.specs[size].name,
            **trainer_bench.torch_trainer(
                model,
                self.batches[size],
                self.device,
                bucket_bytes=self.cfg["bucket_bytes"],
                host_sync=size == "small",
                **self.cfg[f"train_{size}"],
            ),
        }

    def trainer_megatron(self) -> dict[str, Any]:
        if "small" not in self.hf_dirs:
            raise RuntimeError("needs the rollout section's HF directory and batch")
        return {
            "model": self.specs["small"].name,
            **trainer_bench.megatron_trainer(
                self.hf_dirs["small"],
                self.batches["small"],
                self.cfg["dtype"],
                bucket_bytes=self.cfg["bucket_bytes"],
                **self.cfg["train_small"],
            ),
        }

    def weight_sync(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bucket_mb": self.cfg["bucket_bytes"] / 2**20,
            "ipc_kind": "cuda_ipc" if self.device == "cuda" else "shared_memory",
        }
        models = [self.cfg["small"], self.cfg["big"]]
        for transport in self.cfg["sync_transports"]:
            if transport == "nccl":
                probe = weight_sync.probe_nccl(self.device, timeout_s=60)
                out["nccl_probe"] = probe
                if not probe["ok"]:
                    out["nccl"] = "not measurable: two processes on one GPU cannot form an NCCL group"
                    continue
            reports = weight_sync.run_pair(
                {
                    "transport": transport,
                    "device": self.device,
                    "models": models,
                    "smoke": self.smoke,
                    "dtype": self.cfg["dtype"],
                    "bucket_bytes": self.cfg["bucket_bytes"],
                },
                timeout_s=max(30.0, min(240.0, self.report.left_s() - 20.0)),
            )
            out[transport] = weight_sync.summarise(reports)
        return out

    def async_loop(self) -> dict[str, Any]:
        spec = self.specs["small"]
        model = build_model(spec, self.device, self.dtype, seed=1)
        limit = max(10.0, self.report.left_s() - 15.0)
        return {
            "model": spec.name,
            **async_loop.run_async_loop(
                model,
                spec,
                self.device,
                bucket_bytes=self.cfg["bucket_bytes"],
                time_limit_s=limit,
                **self.cfg["async"],
            ),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gpu_check.json")
    ap.add_argument("--cpu-smoke", action="store_true", help="shrunken models on the CPU (tests the script)")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock budget for all sections")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="override the model dtype")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated section names to run (default: all); a trainer "
        "section needs the rollout section of its size",
    )
    args = ap.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --cpu-smoke to test the script on a CPU)", file=sys.stderr)
        return 2
    cfg = settings(args.cpu_smoke)
    cfg["dtype"] = args.dtype or cfg["dtype"]
    torch.set_num_threads(max(1, min(8, torch.get_num_threads())))
    report = Report(args.out, args.budget_s or cfg["budget_s"], {**cfg, "cpu_smoke": args.cpu_smoke})
    try:
        report.set("environment", environment())
    except Exception as e:  # noqa: BLE001 — the measurements matter more than the inventory
        report.set("environment", {"error": f"{type(e).__name__}: {e}"})
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        check = Check(cfg, report, args.cpu_smoke, Path(tmp))
        small, big = cfg["small"], cfg["big"]
        sections = [
            (f"rollout_hf_{small}", lambda: check.rollout("small"), 20),
            (f"trainer_torch_{small}", lambda: check.trainer_torch("small"), 20),
            (f"trainer_megatron_{small}", check.trainer_megatron, 40),
            ("weight_sync", check.weight_sync, 60),
            (f"rollout_hf_{big}", lambda: check.rollout("big"), 45),
            (f"async_loop_{small}", check.async_loop, 35),
            (f"trainer_torch_{big}", lambda: check.trainer_torch("big"), 45),
        ]
        only = {name for name in args.only.split(",") if name}
        unknown = only - {name for name, _, _ in sections}
        if unknown:
            print(f"gpu_check: unknown sections {sorted(unknown)}", file=sys.stderr)
            return 2
        for name, fn, need_s in sections:
            if not only or name in only:
                report.run(name, fn, need_s=need_s)
    has_vllm = report.data["environment"].get("vllm") == "installed"
    report.set(
        "not_measured",
        {
            "vllm": "installed but not benchmarked by this script" if has_vllm else VLLM_NOTE,
            f"trainer_megatron_{big}": (
                f"Megatron's bf16 training keeps ~{ADAM_BYTES_PER_PARAM} B/param (bf16 weights 2, "
                "fp32 main grads 4, fp32 master 4, Adam moments 8): 7.6e9 × 18 B ≈ 137 GB "
                "before activations, more than one 141 GB GPU holds; needs ≥ 2 GPUs (TP/DP)"
            ),
        },
    )
    data = report.finish()
    print(json.dumps(data, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
