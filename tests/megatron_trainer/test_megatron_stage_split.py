"""Uneven pipeline stages without spawning ranks: the layer split rule (Megatron 0.16's), its one-line refusals,
the stage-local HF ↔ Megatron names it gives each stage, and the memory model's fullest stage."""

from __future__ import annotations

import pytest

from engine.config.megatron_model import stage_layers, stage_memory_shares


def test_stage_layers_follow_megatron_and_refuse_numbers_that_do_not_add_up() -> None:
    assert stage_layers(94, 8, 11, 11) == (11, 12, 12, 12, 12, 12, 12, 11)  # verl's Qwen3-235B script
    assert stage_layers(3, 2, 1) == (1, 2) and stage_layers(8, 2) == (4, 4) and stage_layers(9, 3, None, 1) == (4, 4, 1)
    for args, why in (((94, 8, 11, 12), "71 of the model's 94 layers"), ((8, 2, 3, 3), "≠ the model's 8 layers"),
                      ((8, 1, 3), "need pp >= 2"), ((7, 2), "not divisible by pp 2")):
        with pytest.raises(ValueError, match=why) as e:
            stage_layers(*args)
        assert "\n" not in str(e.value)


def test_the_layout_refuses_an_uneven_split_that_does_not_add_up() -> None:
    from engine.trainer.megatron.parallel import ParallelConfigError, ParallelLayout

    ParallelLayout(pp=2, world_size=2, first_stage_layers=1).validate(on_gpu=False, num_layers=3)
    with pytest.raises(ParallelConfigError, match="do not add up"):
        ParallelLayout(pp=2, world_size=2, first_stage_layers=3, last_stage_layers=1).validate(on_gpu=False,
                                                                                               num_layers=3)


def test_each_stage_gets_its_own_layers_under_stage_local_names() -> None:
    from engine.trainer.megatron.convert import ShardInfo, stage_rules
    from engine.trainer.megatron.hf_config import arch_from_hf_config

    arch = arch_from_hf_config({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 5,
                                "intermediate_size": 96, "vocab_size": 61})
    seen = {}
    for stage in range(3):
        rules = stage_rules(arch, ShardInfo(pp_rank=stage, pp_size=3, first_stage_layers=1, last_stage_layers=2))
        seen[stage] = sorted({(r.megatron.split(".")[2], r.hf[0].split(".")[2]) for r in rules
                              if r.megatron.startswith("decoder.layers.")})
    # 5 layers over 3 stages as 1 + 2 + 2: HF layer o_s + i is stage s's local layer i
    assert seen == {0: [("0", "0")], 1: [("0", "1"), ("1", "2")], 2: [("0", "3"), ("1", "4")]}


def test_the_memory_model_counts_the_fullest_stage() -> None:
    assert stage_memory_shares(94, 8, 11, 11) == (12 * 8 / 94, 88)  # stage 0: 11 layers × 8 in flight
    assert stage_memory_shares(8, 2) == (1.0, 8) and stage_memory_shares(8, 1) == (1.0, 8)
    assert stage_memory_shares(8, 2, 3, 3) == (1.0, 8)  # does not add up: counted as even (validate refuses)
