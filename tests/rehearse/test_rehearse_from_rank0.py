"""`asyncrl rehearse` builds FSDP2's ranks other than 0 as `launch` does (issue 43: meta-device init with rank-0 load
and broadcast): a meta skeleton, sharded, its shards filled from rank 0's load by `shard_from_rank0`
(`set_model_state_dict(broadcast_from_rank0=True)`, rank 0's key → size/dtype list handed over by
`engine.rehearse.fake.FromRank0`). A rank 1 that leaves that path, or whose skeleton differs from rank 0's (a key
rank 0 does not send, a weight that unties, another dtype), fails its build naming trainer rank 1.

A 2-layer, 64-wide Llama (SmolLM2's architecture shrunk) as a 2-rank FSDP2 trainer with a KL reference, on the CPU
hardware preset; each rank built, exported and checkpointed as `engine.rehearse.run` does (rank 0 first, one
`FromRank0` between them), without the step (its shapes are not the point here, and `test_rehearse.py` steps it):
~7 s for the first pair of builds, under 1 s for each after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.rehearse.fake import FromRank0
from engine.rehearse.report import RankClass, RehearsalFailure
from engine.rehearse.torch_rank import rehearse_torch_rank

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "presets" / "runs" / "smollm2-arith-cpu.toml"
SETS = ["resources.trainer.gpus_per_node=2", 'trainer.precision="bf16"', 'trainer.attn_implementation="sdpa"',
        'rollout.dtype="bf16"', "resources.trainer.cpu_threads=1", "trainer.use_kl_loss=true"]
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
        "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 100000,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from asyncrl_cli.commands._common import analyze
    from engine.plan.run_plan import resolve_plan
    from engine.rehearse.run import resolved_plan

    model = tmp_path_factory.mktemp("tiny-llama")
    (model / "config.json").write_text(json.dumps(TINY))
    an = analyze(RUN, [*SETS, f'model.path="{model}"'])
    return resolved_plan(resolve_plan(an.config, hardware=an.hardware, derived=an.derived, base_dir=RUN.parent),
                         TINY)[0]


def _ranks(plan) -> tuple[RankClass, RankClass]:  # noqa: ANN001
    """Rank 0, then rank 1 with what rank 0 sent (`engine.rehearse.run`'s order)."""
    rank0 = FromRank0()
    sender = rehearse_torch_rank(plan, TINY, 0, RankClass("rank 0", "0", 0), step=False, rank0=rank0)
    return sender, rehearse_torch_rank(plan, TINY, 1, RankClass("rank 1", "1", 1), step=False, rank0=rank0)


def test_rank_1_gets_its_shards_from_rank_0(plan, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import engine.trainer.fsdp as fsdp

    calls = []
    real = fsdp.shard_from_rank0

    def spy(model, loaded, *args):  # noqa: ANN001, ANN202
        calls.append((torch.distributed.get_rank(), loaded is None, next(model.parameters()).is_meta))
        return real(model, loaded, *args)

    monkeypatch.setattr(fsdp, "shard_from_rank0", spy)
    sender, other = _ranks(plan)
    # the policy and the reference: rank 0 from its load, rank 1 from a meta skeleton and no load
    assert calls == [(0, False, True), (0, False, True), (1, True, True), (1, True, True)]
    assert sender.host_start > 0 and other.host_start == 0  # rank 1 loads nothing on its host
    assert any("shard_from_rank0" in n and "nothing on the host" in n for n in other.notes), other.notes
    # the export and the checkpoint ran on rank 1's received shards: every rank writes its own
    assert other.checkpoint["weights_bytes"] > 0 and other.sync["bytes"] == 0


def _own_load(model: torch.nn.Module) -> torch.nn.Module:
    return model.to_empty(device="cpu")  # weights of its own: rank 1 never asks rank 0 for them


def _extra_key(model: torch.nn.Module) -> torch.nn.Module:
    model.register_buffer("planted", torch.empty(3, device="meta"))
    return model


def _untied(model: torch.nn.Module) -> torch.nn.Module:
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    return model


def _bf16(model: torch.nn.Module) -> torch.nn.Module:
    return model.to(torch.bfloat16)


@pytest.mark.parametrize(("plant", "message"), [
    (_own_load, "made 0 of the 1 object broadcasts rank 0 made building the trainer"),
    (_extra_key, "Missing key(s) in state_dict"),
    (_untied, "lm_head.weight not on rank 0"),
    (_bf16, "'bfloat16') vs rank 0's"),
])
def test_rank_1_that_differs_from_rank_0_fails(plan, monkeypatch: pytest.MonkeyPatch, plant, message) -> None:  # noqa: ANN001
    import engine.models.loader as loader

    real = loader.meta_causal_lm

    def skeleton(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        model = real(*args, **kwargs)
        return plant(model) if torch.distributed.get_rank() else model

    monkeypatch.setattr(loader, "meta_causal_lm", skeleton)
    with pytest.raises(RehearsalFailure) as failed:
        _ranks(plan)
    assert (failed.value.role, failed.value.rank, failed.value.phase) == ("trainer", 1, "build")
    assert message in failed.value.message
