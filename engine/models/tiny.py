"""The tiny Qwen2-architecture model, built in-process (no download): a BPE tokenizer trained with
`tokenizers` on the built-in task strings, and a randomly initialised `Qwen2ForCausalLM`.

Tokenizer: BPE with pre-tokenizer Metaspace (space → `▁`, so decoding restores spaces exactly) → one token
per digit → punctuation isolated; specials `<pad>` (0), `<eos>` (1), `<unk>` (2); no chat template, left
padding. Trained on `engine.data.builtin.corpus_texts(tasks)`, so every built-in prompt of `tasks`
round-trips through encode/decode. The default `tasks=("copy", "reverse")` keeps the vocabulary at 27
tokens, which is what the tiny RL recipe was measured with (a random policy then hits a given digit with
probability ~1/27); `tasks` including "arith" gives a tokenizer that also encodes the word problems, but its
~210 tokens slow RL on copy about 2× (measured: mean reward over steps 250–300 of 0.47 vs 0.88).

Model: hidden 128, intermediate 512, `layers` decoder layers (2), 2 query heads of head_dim 64 (≥ 32, as
vLLM's attention kernels need), 1 KV head, tied input/output embeddings, RoPE (max 512 positions);
weights drawn from `torch.manual_seed(seed)` so the same seed gives the same model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.data.builtin import corpus_texts

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DEFAULT_TASKS: tuple[str, ...] = ("copy", "reverse")
MAX_POSITIONS = 512
TINY_FORMAT_VERSION = 1
"""Bumped when the recipe changes, so cached builds are rebuilt."""


def build_tiny_tokenizer(
    tasks: tuple[str, ...] = DEFAULT_TASKS, vocab_size: int = 256
) -> PreTrainedTokenizerFast:
    """Train the BPE tokenizer on the built-in strings of `tasks` (deterministic) and wrap it for HF."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], show_progress=False)
    tok.train_from_iterator(corpus_texts(tasks), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    return fast


def build_tiny_model(
    vocab_size: int, pad_id: int, eos_id: int, seed: int = 0, layers: int = 2, initializer_range: float = 0.02
) -> PreTrainedModel:
    """A randomly initialised tiny `Qwen2ForCausalLM` (fp32, eval mode), deterministic in `seed`: hidden 128,
    2 heads of dim 64, 1 KV head, tied embeddings. A wider `initializer_range` gives peakier token
    distributions (tests over raw token ids use 0.1)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        initializer_range=initializer_range,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return seeded_model(Qwen2ForCausalLM, config, seed)


def seeded_model(model_cls: type[PreTrainedModel], config: PretrainedConfig, seed: int) -> PreTrainedModel:
    """`model_cls(config)` initialised from `seed` without touching the global RNG, in fp32 and eval mode."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.float().eval()


def build_tiny_model_dir(
    out_dir: str | Path, seed: int = 0, layers: int = 2, tasks: tuple[str, ...] = DEFAULT_TASKS
) -> Path:
    """Build the tokenizer and model and save them as an ordinary HF directory (config.json,
    model.safetensors, generation_config.json, tokenizer files) under `out_dir`; returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(tasks)
    model = build_tiny_model(
        vocab_size=len(tokenizer),
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        seed=seed,
        layers=layers,
    )
    meta = {"builder": "asyncrl tiny-qwen", "format_version": TINY_FORMAT_VERSION, "seed": seed,
            "layers": layers, "tasks": list(tasks)}
    return save_model_dir(model, tokenizer, out, meta)


def save_model_dir(model: Any, tokenizer: Any, out: Path, meta: dict[str, Any]) -> Path:
    """Save a built model and its tokenizer as an ordinary HF directory under `out`, plus the builder's
    `asyncrl_tiny.json` (`meta`: what rebuilds it). The generation config takes the tokenizer's pad and EOS
    ids; BOS = EOS (the tiny tokenizers have no BOS of their own)."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "asyncrl_tiny.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out
