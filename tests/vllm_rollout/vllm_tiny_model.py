"""A tiny random Qwen2 checkpoint (config, safetensors, tokenizer) written in-process, plus plain
transformers references for the vLLM tests: per-token log-probs under the sampling distribution and
greedy decoding. Nothing here imports vLLM or other project modules."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import torch

HIDDEN = 128
HEADS = 2  # head_dim 64: vLLM's CPU attention needs head_dim >= 32
KV_HEADS = 1
LAYERS = 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def have_vllm() -> bool:
    """True when a real vLLM package is installed. With `pythonpath = ["tests"]` the test directory
    `tests/vllm` is itself a namespace package called `vllm`, so a bare `find_spec` is not enough: a real
    package has an origin (its `__init__.py`)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def _corpus() -> list[str]:
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "then",
        "two",
        "plus",
        "three",
        "is",
        "five",
        "while",
        "seven",
        "minus",
        "four",
        "gives",
        "three",
    ]
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(words, size=12)) + f" {i} + {i * 3} = {i * 4}" for i in range(400)]


def build_tokenizer(out_dir: Path):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)
    return fast


def make_model(
    vocab_size: int, eos_id: int, pad_id: int, seed: int, init_range: float = 0.3, quiet_eos: bool = False
):
    """A random tied-embedding Qwen2ForCausalLM in fp32 (`init_range` 0.3 keeps greedy outputs varied).
    `quiet_eos` zeroes the EOS row of the tied embedding/head: its logit is then 0 while the best other
    logit is ~10, so greedy decoding never stops early."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=init_range,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        torch_dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float().eval()
    if quiet_eos:
        with torch.no_grad():
            model.get_input_embeddings().weight[eos_id].zero_()
    return model


def write_checkpoint(out_dir: Path, seed: int = 0):
    """Write tokenizer + model to `out_dir`; return (model, tokenizer)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    model = make_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model, tokenizer


def hf_buckets(model: torch.nn.Module, n_buckets: int, drop_head: bool = True) -> list[dict[str, np.ndarray]]:
    """The model's HF-named weights as `n_buckets` numpy dicts, split by tensor count (so fused layers are
    split across buckets). `drop_head` leaves out the tied `lm_head.weight`, as a trainer exporting
    `named_parameters()` would."""
    items = [(k, v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items()]
    if drop_head:
        items = [(k, v) for k, v in items if k != "lm_head.weight"]
    bounds = np.linspace(0, len(items), n_buckets + 1).astype(int)
    return [dict(items[lo:hi]) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def filtered_log_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """log q for every vocab entry, q ∝ exp(z/T) restricted to the top-k set and the top-p nucleus
    (token kept iff the probability mass strictly above it is < p). T = 0 → log_softmax(z)."""
    logits = logits.double()
    if temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    z = logits / temperature
    if 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(z, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.log_softmax(z, dim=-1)


@torch.no_grad()
def reference_log_probs(
    model: torch.nn.Module,
    prompt: list[int],
    response: list[int],
    temperature: float,
    top_k: int,
    top_p: float,
) -> list[float]:
    """Per-token log q(response_t | prompt, response_<t) from one fp32 forward over the whole sequence."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    lq = filtered_log_probs(logits, temperature, top_k, top_p)
    return lq.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """Greedy decoding with full recomputation (no cache), stopping after an EOS token."""
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([prompt + out])).logits[0, -1]
        token = int(torch.argmax(logits))
        out.append(token)
        if token in eos_ids:
            break
    return out


def integration_run_helpers():
    """`tests/integration/run_helpers.py` (the tiny preset with overrides, run-dir readers), loaded by path: the
    vLLM tests run in their own venv and directory, where `tests/integration` is not importable by name."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "integration_run_helpers"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "integration" / "run_helpers.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
