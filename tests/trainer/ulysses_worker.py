"""One rank of the 2-process Ulysses test (spawned by test_ulysses.py): the same rows through a one-process
trainer (SP = 1) and through the FSDP2 trainer with `ulysses_sequence_parallel_size = 2` (each rank half of every
row's positions): log-probs, entropy, the gradient of one loss, and the weights after a train step."""

from __future__ import annotations

import copy
import json

import torch
import torch.distributed as dist
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed
from engine.trainer.torch_trainer import TorchTrainerBackend

OPTIM = {"lr": 1e-2, "weight_decay": 0.0, "eps": 1e-4}


def text_gqa_lm():
    """A tiny Qwen2 with 4 heads of dim 32 and 2 KV heads (s = 2 divides both: no KV repetition), eager
    attention (the other models run sdpa)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=40, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, pad_token_id=0,
                         eos_token_id=1, initializer_range=0.1, tie_word_embeddings=True,
                         attn_implementation="eager")
    return Qwen2ForCausalLM(config).eval()


def vl_batch(vl_dir: str):
    """Two figure prompts with their image, two responses each (plain text tokens), random advantages."""
    from engine.data.prompts import load_prompts
    from engine.models.loader import load_tokenizer
    from engine.trainer.batch import collate
    from engine.types import Trajectory, TrajectoryGroup

    tok = load_tokenizer(vl_dir)
    prompts, _ = load_prompts({"train_files": ["builtin:figures"], "train_size": 2, "seed": 1}, tok)
    words = tok.encode("the answer is 12 and the figure has 3 sides", add_special_tokens=False)
    groups = [TrajectoryGroup(p, [Trajectory(words[:n], [-1.0] * n, "stop", 0, 0) for n in (3 + i, 7)])
              for i, p in enumerate(prompts)]
    batch = collate(groups, tok.pad_token_id)
    batch.advantages = torch.linspace(-1, 1, len(batch))[:, None] * batch.response_mask
    return batch


def grads(trainer, batch) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """log π and entropy of `batch` (one micro-batch) and the gradient of the token-mean loss, as full tensors."""
    trainer.model.train()
    micro, _ = trainer._prepare(batch)
    log_probs, entropy = trainer._log_probs(micro, True, True)
    loss, _ = token_mean_pg_loss(log_probs, entropy, micro)
    ((loss - 0.01 * (entropy * micro.response_mask).mean()) * trainer._grad_scale()).backward()
    out = {}
    for name, p in trainer.model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g.detach().clone()
    trainer.model.zero_grad(set_to_none=True)
    mask = micro.response_mask
    return out, (log_probs * mask).detach(), (entropy * mask).detach()


def compare(name: str, model: torch.nn.Module, batch, **kw) -> dict:
    ref = TorchTrainerBackend(copy.deepcopy(model), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=64,
                              shared_prompt=False, **kw)
    sp = FSDPTrainerBackend(copy.deepcopy(model), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=64,
                            ulysses_sequence_parallel_size=2, **kw)
    g_ref, lp_ref, ent_ref = grads(ref, batch)
    g_sp, lp_sp, ent_sp = grads(sp, batch)
    lp_step_ref, _ = ref.compute_log_probs(batch)
    lp_step_sp, _ = sp.compute_log_probs(batch)
    m_ref = ref.train_step(batch, token_mean_pg_loss)
    m_sp = sp.train_step(batch, token_mean_pg_loss)
    w_ref = dict(ref.model.named_parameters())
    w_sp = {n: a for b in sp.export_weights(1 << 20) for n, a in b.items()}
    return {
        "name": name, "dp_rank": sp.dp_rank, "width": batch.input_ids.shape[1],
        "log_prob_diff": float((lp_ref - lp_sp).abs().max()),
        "entropy_diff": float((ent_ref - ent_sp).abs().max()),
        "compute_log_prob_diff": float(((lp_step_ref - lp_step_sp) * batch.response_mask).abs().max()),
        "grad_rel_diff": {n: float((g_ref[n] - g_sp[n]).norm() / g_ref[n].norm().clamp(min=1e-12)) for n in g_ref},
        "grad_norm": {n: float(g.norm()) for n, g in g_ref.items()},
        "loss": (m_ref["actor/pg_loss"], m_sp["actor/pg_loss"]),
        "grad_norm_metric": (m_ref["actor/grad_norm"], m_sp["actor/grad_norm"]),
        "weight_diff": max((float((w_ref[n].detach() - w).abs().max()) for n, w in w_sp.items() if n in w_ref),
                           default=float("nan")) if dist.get_rank() == 0 else 0.0,
    }


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        with open(f"{out_dir}/args.json") as f:
            args = json.load(f)
        batch = random_batch(rows=6, seed=3, max_prompt=9, max_response=8)  # odd and even widths across rows
        results = [compare("text-1kv", build_tiny_lm(seed=0), batch),
                   compare("text-gqa", text_gqa_lm(), batch, logprob_chunk_tokens=5, gradient_checkpointing=True)]
        if args.get("vl_dir"):
            from engine.models.loader import load_causal_lm

            results.append(compare("vl", load_causal_lm(args["vl_dir"]), vl_batch(args["vl_dir"])))
        torch.save(results, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
