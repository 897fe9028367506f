"""One seed of the packed-rows study (`benchmarks.packing`) in a fresh process. Prints one JSON line.

    python -m benchmarks.packing_worker PRESET.toml --seed S --steps K --threads T [--set k=v] [--arm NAME=k=v;k=v]
        [--untimed NAME]

The seed's batch is a demo batch as the rollout makes it: `required_samples` prompts of the preset's dataset
(the seed-th slice of them) × `rollout.n` responses sampled from the preset's model at its initial weights
(temperature `rollout.temperature`, up to `max_response_length` tokens, stopping at EOS — the lengths, and so
the padding, are the model's own), rewards alternating 1/0 in each group. Each arm builds the trainer as the
engine does (`build_trainer_backend`, the arm's overrides), counts the tokens of its micro-batches, and — unless it
is `--untimed` — makes a warm-up update, then times `steps` updates (`train_step`); the arms run one after the
other on the same batch, with the on-policy rollout log-probs the first arm computes (bypass mode: π_old is the
rollout's, so a real step makes no log-prob pass either).

Recorded per arm: real tokens Σℓ (Σ attention_mask), padded tokens Σ_k B_k·W_k of the arm's micro-batches (each
padded to its longest row, as the padded forward runs them), the tokens the forward ran on = padded tokens ÷
`asyncrl/trainer/shared_prompt_saving`, the micro-batches per update, and the median update seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def sample_groups(cfg: Any, tok: Any, model_dir: str, seed: int) -> list[Any]:
    """The seed's prompts with `rollout.n` responses sampled from the model (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.data.prompts import load_prompts
    from engine.plan.sizes import required_samples
    from engine.types import Trajectory, TrajectoryGroup

    prompts, _ = load_prompts(cfg.data, tok)
    k = required_samples(cfg)
    chosen = prompts[seed * k:(seed + 1) * k]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    eos, n, limit = tok.eos_token_id, cfg.rollout.n, cfg.data.max_response_length
    groups = []
    with torch.no_grad():
        for prompt in chosen:
            out = model.generate(input_ids=torch.tensor([prompt.prompt_ids]), do_sample=True,
                                 temperature=cfg.rollout.temperature, top_p=1.0, top_k=0, max_new_tokens=limit,
                                 num_return_sequences=n, pad_token_id=tok.pad_token_id, eos_token_id=eos)
            trajs = []
            for j, row in enumerate(out[:, len(prompt.prompt_ids):].tolist()):
                ids = row[: row.index(eos) + 1] if eos in row else row
                trajs.append(Trajectory(ids, [0.0] * len(ids), "stop" if eos in ids else "length", 0, 0,
                                        reward=float(j % 2)))
            groups.append(TrajectoryGroup(prompt, trajs))
    del model
    return groups


def measure_arm(preset: Path, overrides: list[str], groups: list[Any], tok: Any, model_dir: str,
                steps: int, shared: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.engine_runs import load_config
    from engine.algo.batching import prepare_batch
    from engine.algo.loss import build_loss_fn
    from engine.plan.role_parts import backend_spec, batch_prep_spec
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.backends import build_trainer_backend

    cfg = load_config(preset, ["trainer.test_freq=0", *overrides])
    backend = build_trainer_backend(backend_spec(cfg), model_dir, device=resolve_plan(cfg).devices["trainer"])
    batch = prepare_batch(groups, batch_prep_spec(cfg), tok.pad_token_id, 0).batch
    if "log_probs" not in shared:
        shared["log_probs"] = backend.compute_log_probs(batch)[0]
    log_probs = shared["log_probs"]
    batch.rollout_log_probs = log_probs
    batch.old_log_probs = log_probs
    loss_fn = build_loss_fn(cfg.trainer, cfg.algorithm.rollout_correction)
    micros, _, _ = backend._micro_batches(batch, backend.ppo_max_token_len)
    prepared = [backend._prepare(m)[0] for m in micros]
    padded = sum(m.input_ids.numel() for m in prepared)
    forwarded = sum(m.input_ids.numel() if p is None else p.tokens for m, p in
                    zip(prepared, (backend._shared(m) for m in prepared)))  # what `_log_probs` would forward
    times, metrics = [], {}
    if steps:
        backend.train_step(batch, loss_fn)  # warm-up: optimizer state, first-call overheads
    for _ in range(steps):
        t0 = time.perf_counter()
        metrics = backend.train_step(batch, loss_fn)
        times.append(time.perf_counter() - t0)
    out = {
        "rows": len(batch), "real_tokens": int(batch.attention_mask.sum()),
        "response_tokens": int(batch.response_mask.sum()), "padded_tokens": padded,
        "forwarded_tokens": forwarded, "micro_batches": len(micros),
        "packing": backend.packing, "step_times_s": times,
        **({"step_s": statistics.median(times), "grad_norm": float(metrics["actor/grad_norm"]),  # and the
            # trainer's own count of what it forwarded (padded ÷ `shared_prompt_saving`), to check the one above
            "trainer_forwarded_tokens": round(padded / float(metrics["asyncrl/trainer/shared_prompt_saving"]))}
           if times else {}),
        "precision": cfg.trainer.precision, "attn_implementation": cfg.trainer.attn_implementation,
    }
    del backend
    gc.collect()
    return out


def measure(preset: Path, seed: int, arms: dict[str, list[str]], steps: int, threads: int,
            overrides: list[str], untimed: list[str]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from benchmarks.engine_runs import load_config
    from engine.models.loader import load_tokenizer, resolve_model_path

    cfg = load_config(preset, ["trainer.test_freq=0", *overrides])
    model_dir = str(resolve_model_path(cfg.model.path, seed=cfg.trainer.seed))
    tok = load_tokenizer(model_dir)
    t0 = time.perf_counter()
    groups = sample_groups(cfg, tok, model_dir, seed)
    lengths = [len(t.response_ids) for g in groups for t in g.trajectories]
    result: dict[str, Any] = {"seed": seed, "model": cfg.model.path, "sample_s": time.perf_counter() - t0,
                              "response_lengths": lengths, "threads": threads, "arms": {}}
    shared: dict[str, Any] = {}
    for arm, extra in arms.items():
        result["arms"][arm] = measure_arm(preset, [*overrides, *extra], groups, tok, model_dir,
                                          0 if arm in untimed else steps, shared)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing_worker")
    parser.add_argument("preset", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--arm", dest="arms", action="append", default=[],
                        help="NAME=override;override (repeatable; in order)")
    parser.add_argument("--untimed", action="append", default=[], help="an arm counted but not timed")
    args = parser.parse_args(argv)
    arms = {a.partition("=")[0]: [o for o in a.partition("=")[2].split(";") if o] for a in args.arms}
    print(json.dumps(measure(args.preset, args.seed, arms, args.steps, args.threads, args.overrides, args.untimed)),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
