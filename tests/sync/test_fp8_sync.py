"""FP8 rollout weights through the weight sync (`rollout.quantization = "fp8"`, `engine.sync.fp8`): the sender
quantises each bucket of a real HF model's export; the bytes packed, fingerprinted, sent and counted are the fp8
ones (≈ half of bf16 for the decoder layers' linear weights), every receiver gets exactly them (the delivery
check's fingerprints), the weights it would compute with (q · s) are within the quantiser's bound of the
trainer's, and embeddings, norms, biases, the LM head and the router are sent untouched, bit for bit."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from engine.plan.memory import sync_bytes
from engine.sync.fp8 import (QUANTIZATION_CONFIG, SCALE_SUFFIX, dequantize_blockwise, quantizable, quantize_bucket,
                             scale_name)
from engine.sync.runtime import publish
from engine.sync.shared_memory import SharedMemorySync
from engine.sync.shared_memory import pull as shm_pull

pytestmark = pytest.mark.timeout(120)


def tiny_qwen_export() -> dict[str, torch.Tensor]:
    """A real HF Qwen2 model's `named_parameters()` in bf16 (what the torch trainer exports, HF names): 2 decoder
    layers of width 256, one ragged matrix (k/v: 128 × 256 → 1 × 2 blocks; down_proj 256 × 320: a partial block)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=640, hidden_size=256, intermediate_size=320, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    return {k: v.detach() for k, v in model.named_parameters()}


def bucket_of(export: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    return {n: export[n] for n in names}


def send_and_receive(buckets: list[dict[str, torch.Tensor]], quantization: str | None):
    """One sync through the real shared-memory transport to one receiver thread: (what was sent, what arrived as
    name → tensor, the receiver's per-bucket fingerprints)."""
    from engine.sync.flat import fingerprint
    from engine.trainer.fsdp import free_port

    got: dict[str, torch.Tensor] = {}
    sums: list[int] = []

    def receive(handle) -> None:
        for fb in shm_pull(handle, 1):
            sums.append(fingerprint(fb.data))
            got.update({k: v.clone() for k, v in fb.tensors()})

    def send(refs):
        t = threading.Thread(target=receive, args=(refs[0],))
        t.start()
        return t

    sync = SharedMemorySync("127.0.0.1", free_port(), 2, run_id=f"fp8{os.getpid()}", slot_bytes=1 << 20)
    try:
        sent = publish(sync, 1, buckets, send, quantization=quantization)
        sent.out.join(timeout=60)
    finally:
        sync.close()
    return sent, got, sums


def test_the_sync_sends_fp8_decoder_weights_and_the_rest_untouched() -> None:
    export = tiny_qwen_export()
    names = list(export)
    buckets = [bucket_of(export, names[:7]), bucket_of(export, names[7:])]  # a layer split across two buckets
    eligible = [n for n in names if quantizable(n, export[n])]
    assert eligible and all(".layers." in n and n.endswith("proj.weight") for n in eligible)
    untouched = [n for n in names if n not in eligible]
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.0.self_attn.q_proj.bias", "model.layers.1.post_attention_layernorm.weight"} <= set(untouched)

    plain, _, _ = send_and_receive(buckets, None)
    sent, got, sums = send_and_receive(buckets, "fp8")

    # the delivery check is over what was sent: the receiver's fingerprints of the fp8 buckets equal the sender's
    assert sums == sent.fingerprints and len(sums) == len(sent.names) >= 2
    assert sorted(got) == sorted(names + [scale_name(n) for n in eligible])
    assert sorted(n for b in sent.names for n in b) == sorted(got)

    # bytes: the event counts what travelled; eligible weights ≈ half of bf16 (1 byte + 4 per 128² block)
    bf16_eligible = sum(export[n].numel() * 2 for n in eligible)
    fp8_eligible = sum(got[n].numel() + got[scale_name(n)].numel() * 4 for n in eligible)
    assert 0.5 <= fp8_eligible / bf16_eligible < 0.51
    rest = sum(export[n].numel() * 2 for n in untouched)
    assert sent.nbytes < plain.nbytes
    assert sent.nbytes == pytest.approx(rest + fp8_eligible, rel=0.02)  # + the 64-byte alignment of each tensor
    assert plain.nbytes == pytest.approx(rest + bf16_eligible, rel=0.02)
    # `asyncrl plan`'s one formula (engine.plan.memory.sync_bytes) predicts both
    p, e = sum(t.numel() for t in export.values()), 2 * 640 * 256
    assert sync_bytes(p, 2, e, "fp8") == pytest.approx(sent.nbytes, rel=0.02)
    assert sync_bytes(p, 2) == pytest.approx(plain.nbytes, rel=0.02)

    for n in eligible:  # vLLM's block-fp8 layout: fp8 weight, fp32 scale per 128 × 128 block, the quantiser's bound
        w, q, s = export[n].float(), got[n], got[scale_name(n)]
        assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
        assert s.dtype == torch.float32 and s.shape == (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
        per_elem = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]
        err = (w - dequantize_blockwise(q, s, torch.float32)).abs()
        assert (err <= 2**-4 * w.abs() + 2**-10 * per_elem + 1e-12).all() and err.max() > 0
    for n in untouched:
        assert got[n].dtype == torch.bfloat16 and torch.equal(got[n], export[n]), n


def test_the_trainer_export_is_not_modified_and_a_moe_router_stays_unquantised() -> None:
    g = torch.Generator().manual_seed(1)
    bucket = {"model.layers.0.mlp.gate.weight": torch.randn(8, 256, generator=g).bfloat16(),
              "model.layers.0.mlp.experts.3.up_proj.weight": torch.randn(256, 256, generator=g).bfloat16(),
              "model.layers.0.mlp.shared_expert_gate.weight": torch.randn(1, 256, generator=g).bfloat16(),
              "model.visual.blocks.0.attn.qkv.weight": torch.randn(384, 128, generator=g).bfloat16()}
    before = {k: v.clone() for k, v in bucket.items()}
    out = quantize_bucket(bucket)
    assert all(torch.equal(bucket[k], before[k]) for k in bucket)  # the trainer's tensors: untouched
    assert list(out) == ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.3.up_proj.weight",
                         "model.layers.0.mlp.experts.3.up_proj." + SCALE_SUFFIX,
                         "model.layers.0.mlp.shared_expert_gate.weight", "model.visual.blocks.0.attn.qkv.weight"]
    assert out["model.layers.0.mlp.experts.3.up_proj.weight"].dtype == torch.float8_e4m3fn
    for k in ("model.layers.0.mlp.gate.weight", "model.layers.0.mlp.shared_expert_gate.weight",
              "model.visual.blocks.0.attn.qkv.weight"):
        assert out[k] is bucket[k]
    assert QUANTIZATION_CONFIG["weight_block_size"] == [128, 128] and QUANTIZATION_CONFIG["quant_method"] == "fp8"


def test_an_unknown_quantization_is_refused() -> None:
    with pytest.raises(ValueError, match="fp8"):
        publish(object(), 1, [], lambda refs: None, quantization="int4")
