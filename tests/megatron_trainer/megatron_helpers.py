"""Shared helpers of the Megatron tests: tiny random HF checkpoints, batches, HF reference log-probs, and a
spawn harness for multi-process (gloo) runs."""

from __future__ import annotations

import queue
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.trainer.base import TrainBatch

VOCAB = 61  # odd on purpose: TP = 2 needs vocab padding
KINDS = ("qwen2", "qwen3", "qwen3_moe", "llama")


def tiny_hf_model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A random tiny HF causal LM of family `kind` (head_dim 32, 2 layers, fp32, eval mode).

    qwen2: GQA 4/2, qkv bias, tied embeddings. qwen3: q/k norm, untied. qwen3_moe: 4 experts top-2 with
    `norm_topk_prob`, layer 1 dense (`mlp_only_layers`). llama: attention + MLP biases, RoPE θ = 5000.
    """
    import transformers as tf

    common = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "initializer_range": 0.2,
              "max_position_embeddings": 128}
    torch.manual_seed(seed)
    if kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**common, tie_word_embeddings=True))
        with torch.no_grad():  # HF initialises biases to zero; make them matter
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.2)
    elif kind == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**common, tie_word_embeddings=False))
    elif kind == "qwen3_moe":
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
            **common, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
            mlp_only_layers=[1]))
    elif kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common, attention_bias=True, mlp_bias=True,
                                                   rope_theta=5000.0))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.2)
    else:
        raise ValueError(kind)
    return model.eval()


def save_tiny(kind: str, directory: Path, seed: int = 0) -> Path:
    tiny_hf_model(kind, seed).save_pretrained(directory)
    return directory


def make_batch(rows: int = 4, prompt: int = 5, response: int = 4, seed: int = 1) -> TrainBatch:
    """Left-padded prompts of varying length, right-padded responses of varying length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for r in range(rows):
        mask[r, : r % 3] = 0  # 0, 1, 2 left pads
        mask[r, prompt + response - (r % 2):] = 0  # every other response one token shorter
    ids = ids * mask
    return TrainBatch(
        input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        responses=ids[:, prompt:].clone(), response_mask=mask[:, prompt:].float(),
        rollout_log_probs=torch.zeros(rows, response),
    )


def hf_log_probs(model: torch.nn.Module, batch: TrainBatch, temperature: float,
                 grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference log π(response) and entropy [B, R] from transformers (masked to the response)."""
    p = batch.prompt_len
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits[:, p - 1:-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1) * batch.response_mask
        entropy = -(logp.exp() * logp).sum(-1) * batch.response_mask
    return picked, entropy


def nll_loss(log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood of the responses (a `LossFn`)."""
    mask = batch.response_mask
    loss = -(log_probs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"test/nll": float(loss.detach())}


def hf_grad_norm(model: torch.nn.Module, batch: TrainBatch, temperature: float) -> float:
    """‖∇ token-mean NLL‖ of the HF model on `batch` (the reference for the backend's grad norm)."""
    model.zero_grad()
    lp, _ = hf_log_probs(model, batch, temperature, grad=True)
    loss, _ = nll_loss(lp, None, batch)
    loss.backward()
    total = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    model.zero_grad()
    return total ** 0.5


def _to_numpy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


def _entry(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple, out: Any) -> None:
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    try:
        out.put((rank, "ok", _to_numpy(fn(rank, world, port, *args))))
    except BaseException:  # noqa: BLE001 - report any failure of the child to the parent
        out.put((rank, "error", traceback.format_exc()))


def spawn(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 150.0) -> list[Any]:
    """Run `fn(rank, world, port, *args)` in `world` spawned processes; their results (tensors → numpy) by rank."""
    import torch.multiprocessing as mp

    from engine.trainer.megatron.backend import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, status, value = out.get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    except queue.Empty as exc:
        raise AssertionError(f"spawned ranks did not report within {timeout}s") from exc
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


def as_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a))


def assert_exports_checkpoint(exported: dict[str, Any], hf_dir: Path, extra: frozenset[str] = frozenset()) -> None:
    """`exported` holds exactly the HF checkpoint's tensors in `hf_dir` (plus the names in `extra`), bit for bit."""
    from engine.trainer.megatron.convert import SafetensorsSource

    source = SafetensorsSource(hf_dir)
    assert set(exported) == set(source.keys()) | extra
    for name in source:
        assert torch.equal(as_tensor(exported[name]), source(name)), name
