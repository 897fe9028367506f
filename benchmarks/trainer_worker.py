"""One trainer-throughput measurement in a fresh process (Megatron sets up a process group; a clean process
per backend keeps the measurements independent). Prints one JSON line.

    python -m benchmarks.trainer_worker PRESET.toml --backend torch|megatron --steps K --threads T [--set k=v]

It builds the backend exactly as the engine does (`build_trainer_backend`), makes one GRPO batch of the
preset's shape — `ppo_mini_batch_size` prompts from the preset's dataset × `rollout.n` responses of
`max_response_length` random tokens, rewards alternating 1/0 in each group so every row has a non-zero
advantage — through the engine's `prepare_batch`, takes the rollout log-probs from the backend itself
(on-policy, bypass mode), and times `train_step` with the preset's GRPO loss (`build_loss_fn`).

    tokens/s = tokens of the batch (Σ attention_mask, as `asyncrl/trainer/tokens_per_s`) ÷ median step seconds
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def make_groups(cfg: Any, tok: Any, vocab: int, seed: int = 0) -> list[Any]:
    """`required_samples` prompt groups of `n` full-length random responses with alternating rewards."""
    from engine.plan.sizes import required_samples
    from engine.data.prompts import load_prompts
    from engine.types import Trajectory, TrajectoryGroup

    prompts, _ = load_prompts(cfg.data, tok)
    rng = random.Random(seed)
    special = {tok.pad_token_id, tok.eos_token_id}
    length = cfg.data.max_response_length
    candidates = [t for t in range(min(vocab, 4096)) if t not in special]
    groups = []
    for prompt in prompts[: required_samples(cfg)]:
        trajs = []
        for j in range(cfg.rollout.n):
            ids = [rng.choice(candidates) for _ in range(length)]
            trajs.append(Trajectory(ids, [0.0] * length, "length", 0, 0, reward=float(j % 2)))
        groups.append(TrajectoryGroup(prompt, trajs))
    return groups


def measure(
    preset: Path, backend_name: str, steps: int, threads: int, overrides: list[str]
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from benchmarks.engine_runs import load_config
    from engine.algo.loss import build_loss_fn
    from engine.models.loader import load_tokenizer, resolve_model_path
    from engine.plan.role_parts import backend_spec, batch_prep_spec
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.backends import build_trainer_backend
    from engine.algo.batching import prepare_batch

    cfg = load_config(preset, [f'trainer.backend="{backend_name}"', "trainer.test_freq=0", *overrides])
    model_dir = str(resolve_model_path(cfg.model.path, seed=cfg.trainer.seed))
    tok = load_tokenizer(model_dir)
    t0 = time.perf_counter()
    backend = build_trainer_backend(backend_spec(cfg), model_dir, device=resolve_plan(cfg).devices["trainer"])
    build_s = time.perf_counter() - t0
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    prep = prepare_batch(make_groups(cfg, tok, vocab), batch_prep_spec(cfg), tok.pad_token_id, 0)
    batch = prep.batch
    t0 = time.perf_counter()
    log_probs, _ = backend.compute_log_probs(batch)
    logprob_s = time.perf_counter() - t0
    batch.rollout_log_probs = log_probs
    batch.old_log_probs = log_probs
    loss_fn = build_loss_fn(cfg.trainer, cfg.algorithm.rollout_correction)
    backend.train_step(batch, loss_fn)  # warm-up: optimizer state allocation, first-call overheads
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        metrics = backend.train_step(batch, loss_fn)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    return {
        "backend": backend_name,
        "model": cfg.model.path,
        "rows": len(batch),
        "tokens": prep.num_tokens,
        "response_tokens": int(batch.response_mask.sum()),
        "micro_batch": cfg.trainer.ppo_micro_batch_size_per_gpu,
        "threads": threads,
        "build_s": build_s,
        "step_s": step_s,
        "step_times_s": times,
        "tokens_per_s": prep.num_tokens / step_s,
        "logprob_s": logprob_s,
        "logprob_tokens_per_s": prep.num_tokens / logprob_s,
        "grad_norm": float(metrics.get("actor/grad_norm", 0.0)),
        "shared_prompt_saving": float(metrics.get("asyncrl/trainer/shared_prompt_saving", 1.0)),
        "precision": cfg.trainer.precision,
        "attn_implementation": cfg.trainer.attn_implementation,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trainer_worker")
    parser.add_argument("preset", type=Path)
    parser.add_argument("--backend", choices=["torch", "megatron"], required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    print(
        json.dumps(measure(args.preset, args.backend, args.steps, args.threads, args.overrides)), flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
