"""Study — fp32 master weights vs a pure-bf16 optimizer at the presets' learning rate (issue 23).

One update at lr = 1e-6 (`qwen2.5-math-7b`'s) on a 2-layer slice of Qwen2.5-7B's real width — hidden 3584,
intermediate 18944, 28 query / 4 KV heads, untied output layer, Qwen2.5's `initializer_range` 0.02 (random
init: no hub here) — with the vocabulary cut to 4096 to keep memory near 5 GB. Both policies run the trainer
itself (`TorchTrainerBackend.train_step`, the backend `build_trainer_backend` builds for one rank):

    production   `model.dtype = "bfloat16"` with fp32 master weights: fp32 parameters, AdamW state and
                 gradients, bf16 autocast compute (`engine.config.precision`)
    pure-bf16    `trainer.fp32_master_weights = false`: the parameters, gradients and AdamW state in bf16

and counts, per parameter group, the fraction of weights whose stored value changed, over the weights with a
nonzero gradient (the embedding rows of tokens absent from the batch get none, in either policy).

Memory: to stay near 5 GB, each group (embedding, layer 0, layer 1, final norm + output layer) is updated in
its own `train_step` from the same starting weights, the others frozen (`requires_grad = False`; AdamW holds
state for the trainable ones only). A parameter's gradient does not depend on which other parameters are
trainable, and AdamW's step is elementwise, so this is the joint update exactly — except for the global
gradient clip, which is off (`grad_clip = 1e9`): Adam's first step m̂/√v̂ = g/|g| is scale-free anyway.
Loss: token-mean REINFORCE −Σ A·log π / Σ m with random advantages (the PPO-clip gradient at ratio 1).

    python -m benchmarks.master_weights        # writes benchmarks/results/master-weights.json
"""

from __future__ import annotations

import gc
import resource
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, finish_result, new_result, table, write_json

STUDY = "master-weights"
WIDTH = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
         "num_hidden_layers": 2, "vocab_size": 4096, "tie_word_embeddings": False, "initializer_range": 0.02,
         "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096}
LR, ROWS, PROMPT, RESPONSE = 1e-6, 2, 32, 96


def build_slice(seed: int = 0) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**WIDTH)).eval()


def batch(seed: int = 0) -> Any:
    import torch

    from engine.trainer.batch import collate
    from engine.types import Trajectory

    gen = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(ROWS):
        prompt = torch.randint(2, WIDTH["vocab_size"], (PROMPT,), generator=gen).tolist()
        response = torch.randint(2, WIDTH["vocab_size"], (RESPONSE,), generator=gen).tolist()
        items.append((prompt, Trajectory(response, [-1.0] * RESPONSE, "length", 0, 0)))
    b = collate(items, pad_token_id=0)
    b.advantages = torch.randn(b.responses.shape, generator=gen) * b.response_mask
    return b


def reinforce(log_probs: Any, entropy: Any, mb: Any) -> tuple[Any, dict[str, float]]:
    mask = mb.response_mask
    loss = -(mb.advantages * log_probs * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {}


def groups(model: Any) -> dict[str, list[str]]:
    names = [n for n, _ in model.named_parameters()]
    return {"embedding": [n for n in names if "embed_tokens" in n],
            "layer 0": [n for n in names if ".layers.0." in n],
            "layer 1": [n for n in names if ".layers.1." in n],
            "norm + output layer": [n for n in names if n.startswith("lm_head") or n == "model.norm.weight"]}


def one_policy(label: str, pure_bf16: bool) -> dict[str, Any]:
    """Per group: weights changed / weights with a nonzero gradient, and the step's wall time."""
    import torch

    from engine.trainer.torch_trainer import TorchTrainerBackend

    model = build_slice()
    if pure_bf16:
        model = model.to(torch.bfloat16)
    params = dict(model.named_parameters())
    out: dict[str, Any] = {"label": label, "param_dtype": str(next(model.parameters()).dtype), "groups": {}}
    for group, names in groups(model).items():
        for n, p in params.items():
            p.requires_grad_(n in names)
        start = {n: params[n].detach().clone() for n in names}
        grads_nonzero: dict[str, torch.Tensor] = {}
        hooks = [params[n].register_post_accumulate_grad_hook(
            lambda p, n=n: grads_nonzero.__setitem__(n, p.grad.detach() != 0)) for n in names]
        trainer = TorchTrainerBackend(model, optim_cfg={"lr": LR, "weight_decay": 0.01}, grad_clip=1e9,
                                      micro_batch_size=ROWS, precision="bf16")
        t0 = time.perf_counter()
        metrics = trainer.train_step(batch(), reinforce)
        seconds = time.perf_counter() - t0
        assert metrics["actor/skipped_step"] == 0
        changed = sum(int((params[n].detach() != start[n]).sum()) for n in names)
        with_grad = sum(int(grads_nonzero[n].sum()) for n in names)
        total = sum(start[n].numel() for n in names)
        changed_with_grad = sum(int(((params[n].detach() != start[n]) & grads_nonzero[n]).sum()) for n in names)
        out["groups"][group] = {"weights": total, "with_grad": with_grad, "changed": changed,
                                "changed_of_with_grad": changed_with_grad / max(1, with_grad),
                                "changed_of_all": changed / total, "step_s": round(seconds, 1)}
        with torch.no_grad():  # the next group starts from the same weights
            for n in names:
                params[n].copy_(start[n])
        for h in hooks:
            h.remove()
        del trainer, start
        gc.collect()
    decoder = [out["groups"][g] for g in ("layer 0", "layer 1")]
    out["decoder_changed"] = sum(g["changed"] for g in decoder) / sum(g["with_grad"] for g in decoder)
    every = list(out["groups"].values())
    out["all_changed_of_with_grad"] = sum(g["changed"] for g in every) / sum(g["with_grad"] for g in every)
    del model, params
    gc.collect()
    return out


def run(out_dir: Path = RESULTS_DIR) -> dict[str, Any]:
    import torch

    started = time.monotonic()
    result = new_result(STUDY, "full", {"width": WIDTH, "lr": LR, "rows": ROWS, "prompt": PROMPT,
                                        "response": RESPONSE, "threads": torch.get_num_threads()})
    result["command"] = "python -m benchmarks.master_weights"
    runs = [one_policy("production (fp32 masters, bf16 compute)", False),
            one_policy("pure bf16 (fp32_master_weights = false)", True)]
    result["runs"] = runs
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    rows = [[r["label"], g, f"{s['weights']:,}", f"{s['with_grad']:,}", f"{100 * s['changed_of_with_grad']:.2f} %",
             s["step_s"]] for r in runs for g, s in r["groups"].items()]
    result["tables"] = [table("One update at lr 1e-6, 2-layer Qwen2.5-7B-width slice (vocab 4096)",
                              ["policy", "group", "weights", "with a nonzero gradient", "changed (of those)",
                               "step s"], rows)]
    result["targets"] = [
        {"name": "production policy changes ≥ 99 % of the decoder weights", "value": runs[0]["decoder_changed"],
         "met": runs[0]["decoder_changed"] >= 0.99},
        {"name": "pure bf16 changes only a few percent", "value": runs[1]["decoder_changed"],
         "met": runs[1]["decoder_changed"] < 0.10},
    ]
    path = write_json(finish_result(result, started), out_dir)
    print(path)
    for r in runs:
        print(r["label"], f"decoder {100 * r['decoder_changed']:.2f} %",
              f"all (with grad) {100 * r['all_changed_of_with_grad']:.2f} %")
    return result


if __name__ == "__main__":
    run()
