"""The tiny Qwen3-VL, built in-process (no download): a BPE tokenizer with Qwen's vision and chat special
tokens and a small chat template, a randomly initialised `Qwen3VLForConditionalGeneration` (tiny vision
tower + tiny language model), and a Qwen2-VL image processor — saved as an ordinary HF directory.

Tokenizer: as the tiny text model's (Metaspace → one token per digit → punctuation isolated), trained on
the `figures` task's strings and the chat scaffolding to 64 tokens — mostly single characters, so a random
policy starts its answer with a digit about 10/64 of the time (the `figures` reward's first rung); specials `<pad>` (0), `<|im_end|>` (1, EOS),
`<unk>` (2), `<|im_start|>`, `<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`. Its
chat template renders a message as `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`, an image item of a content
list as `<|vision_start|><|image_pad|><|vision_end|>`, and the generation prompt as
`<|im_start|>assistant\\n` (Qwen's layout).

Model: language model hidden 128, intermediate 256, `layers` decoder layers (2), 2 query heads of head_dim
64, 1 KV head, M-RoPE sections (12, 10, 10) interleaved (Σ = head_dim / 2), untied head (as Qwen3-VL-8B);
vision tower depth 2, hidden 64, 2 heads (head_dim 32), patch 16, temporal patch 2, spatial merge 2, one
deepstack merger (after ViT block 0, added after decoder layer 0), 64 learned position embeddings (8 × 8).
Weights from `torch.manual_seed(seed)`.

Image processor: patch 16, merge 2, 32² ≤ pixels ≤ 128², mean = std = 0.5 (Qwen3-VL's); a 96 × 96 figure
becomes a 6 × 6 patch grid, i.e. 9 vision tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.data.figures import corpus_texts
from engine.models.portable import portable_rope, vl_tokenizer_class
from engine.models.tiny import save_model_dir, seeded_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<|im_end|>", "<unk>"
IM_START, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = (
    "<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
SPECIALS = [PAD, EOS, UNK, IM_START, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
MAX_POSITIONS = 1024
TINY_VL_FORMAT_VERSION = 2
"""Bumped when the recipe changes, so cached builds are rebuilt (2: files both transformers 4.5x and 5.x read)."""
PATCH, MERGE, TEMPORAL = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 32 * 32, 128 * 128

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def build_tiny_vl_tokenizer(vocab_size: int = 64) -> PreTrainedTokenizerFast:
    """Train the BPE tokenizer on the figures strings plus the chat roles (deterministic), wrap it for HF."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator([*corpus_texts(), "user\n", "assistant\n", "system\n", "\\boxed{}"], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left",
        model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False,
        additional_special_tokens=SPECIALS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_vl_config(tokenizer: PreTrainedTokenizerFast, layers: int = 2) -> Any:
    """The tiny model's `Qwen3VLConfig`. The language model's RoPE is given in both spellings
    (`engine.models.portable.portable_rope`), so transformers 4.5x and 5.x build the same model."""
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    config = Qwen3VLConfig(
        text_config=portable_rope({
            "vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
            "max_position_embeddings": MAX_POSITIONS, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [12, 10, 10],
                                "mrope_interleaved": True},
            "bos_token_id": ids[EOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD],
        }),
        vision_config={
            "depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "patch_size": PATCH,
            "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL, "out_hidden_size": 128,
            "num_position_embeddings": 64, "deepstack_visual_indexes": [0],
        },
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def build_tiny_vl_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, layers: int = 2) -> PreTrainedModel:
    """A randomly initialised tiny `Qwen3VLForConditionalGeneration` (fp32, eval), deterministic in `seed`."""
    from transformers import Qwen3VLForConditionalGeneration

    return seeded_model(Qwen3VLForConditionalGeneration, tiny_vl_config(tokenizer, layers), seed)


def build_image_processor() -> Any:
    """Qwen2-VL's image processor (PIL backend) with the tiny model's patching and pixel range."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as Processor,
        )
    except ImportError:  # transformers < 5.2x: the slow (PIL/numpy) processor is the plain class
        from transformers import Qwen2VLImageProcessor as Processor

    return Processor(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL, min_pixels=MIN_PIXELS,
                     max_pixels=MAX_PIXELS, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def build_tiny_vl_model_dir(out_dir: str | Path, seed: int = 0, layers: int = 2) -> Path:
    """Build tokenizer, model and image processor and save them as an HF directory (config.json,
    model.safetensors, generation_config.json, tokenizer files, preprocessor_config.json)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_vl_tokenizer()
    model = build_tiny_vl_model(tokenizer, seed=seed, layers=layers)
    build_image_processor().save_pretrained(out)
    meta = {"builder": "asyncrl tiny-qwen3-vl", "format_version": TINY_VL_FORMAT_VERSION, "seed": seed,
            "layers": layers}
    save_model_dir(model, tokenizer, out, meta)
    _set_tokenizer_class(out)
    return out


def _set_tokenizer_class(out: Path) -> None:
    """Save the tokenizer under the class the installed transformers' Qwen3-VL processor accepts
    (`engine.models.portable.vl_tokenizer_class`)."""
    import json

    import transformers

    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = vl_tokenizer_class(transformers.__version__)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
