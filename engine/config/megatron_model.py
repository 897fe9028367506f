"""The Megatron trainer's model settings (`[trainer]` keys, Megatron's names as verl's
`override_transformer_config` spells them), a base of `TrainerConfig`: uneven pipeline stages, the MoE router's
auxiliary losses and dropout. Unlike `engine.config.megatron_perf`'s settings these change the experiment (what
is computed), not only its speed. Pure pydantic; `stage_layers` is the one rule of the layer split.

Uneven pipeline stages (Megatron's `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`):
with f (first) and/or l (last) set, the L − f − l remaining layers are split evenly over the p − (#set) middle
stages; unset = the even split L / p. The numbers must add up (`stage_layers` says why in one line).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.config.section import Section


def stage_layers(num_layers: int, pp: int, first: int | None = None, last: int | None = None) -> tuple[int, ...]:
    """Decoder layers per pipeline stage (Megatron 0.16's rule, module docstring). Raises ValueError, one line,
    when they do not add up."""
    if pp < 1:
        raise ValueError("pp must be >= 1")
    if first is None and last is None:
        if num_layers % pp:
            raise ValueError(f"num_layers {num_layers} is not divisible by pp {pp}")
        return (num_layers // pp,) * pp
    if pp < 2:
        raise ValueError("num_layers_in_first/last_pipeline_stage need pp >= 2 (one stage holds every layer)")
    for name, n in (("first", first), ("last", last)):
        if n is not None and n < 1:
            raise ValueError(f"num_layers_in_{name}_pipeline_stage must be >= 1, got {n}")
    middle_stages = pp - (first is not None) - (last is not None)
    middle_layers = num_layers - (first or 0) - (last or 0)
    stated = " + ".join(f"{n} ({name})" for name, n in (("first", first), ("last", last)) if n is not None)
    if middle_stages == 0 and middle_layers != 0:
        raise ValueError(f"the pipeline stages do not add up: {stated} ≠ the model's {num_layers} layers at pp = {pp}")
    if middle_stages and (middle_layers <= 0 or middle_layers % middle_stages):
        raise ValueError(f"the pipeline stages do not add up: {stated} leave {middle_layers} of the model's "
                         f"{num_layers} layers for the {middle_stages} middle stage(s) of pp = {pp}, which take "
                         f"them evenly (so a positive multiple of {middle_stages})")
    per = middle_layers // middle_stages if middle_stages else 0
    return tuple([first] if first is not None else []) + (per,) * middle_stages + \
        tuple([last] if last is not None else [])


def stage_memory_shares(num_layers: int, pp: int, first: int | None = None,
                        last: int | None = None) -> tuple[float, int]:
    """(w, a) of the pipeline stage that needs the most memory (`engine.plan.memory`): w = its share of the layer
    parameters relative to the even split, max_s n_s · pp / L; a = the layers whose activations it holds in
    Megatron's 1F1B schedule, max_s n_s · (pp − s) (stage s has pp − s micro-batches in flight; L for an even
    split). Numbers that do not add up count as the even split (`validate` refuses them on its own)."""
    try:
        sizes = stage_layers(num_layers, pp, first, last)
    except ValueError:
        return 1.0, num_layers
    if pp <= 1 or not num_layers:
        return 1.0, num_layers
    return max(sizes) * pp / num_layers, max(n * (pp - s) for s, n in enumerate(sizes))


class MegatronModelConfig(Section):
    """Megatron model settings that change what is computed (module docstring)."""

    num_layers_in_first_pipeline_stage: int | None = Field(None, gt=0)
    """megatron, pp > 1: decoder layers on the first pipeline stage (Megatron's key; verl's
    `override_transformer_config.num_layers_in_first_pipeline_stage`). None = the even split. The first stage also
    holds the embedding and the last one the output layer, hence fewer layers there balance the stages."""
    num_layers_in_last_pipeline_stage: int | None = Field(None, gt=0)
    """megatron, pp > 1: decoder layers on the last pipeline stage (Megatron's key). The middle stages take the
    rest evenly; `validate` refuses numbers that do not add up, in one line."""
    moe_router_load_balancing_type: Literal["none", "aux_loss", "seq_aux_loss"] = "none"
    """megatron, MoE: the router's load-balancing loss (Megatron's key). `none` is verl's setting (its Megatron
    engine sets it whatever the model's config says: "aux_loss hurts perf in RL"), so `moe_aux_loss_coeff`
    alone has no effect, in verl as here; `aux_loss` = Switch-Transformer's E·Σ_e f_e·P_e over the micro-batch,
    `seq_aux_loss` = the same per sequence."""
    moe_aux_loss_coeff: float = Field(0.0, ge=0)
    """megatron, MoE: weight of the load-balancing loss chosen by `moe_router_load_balancing_type` (Megatron's
    key). Its gradient is added in the router's backward, scaled like the main loss (mean over the update's
    micro-batches, averaged over data-parallel ranks); metric `actor/load_balancing_loss` (Megatron's name)."""
    moe_z_loss_coeff: float | None = Field(None, ge=0)
    """megatron, MoE: weight of the router z-loss, mean over tokens of (logsumexp of the router logits)², ST-MoE
    (Megatron's key; applies whatever the load-balancing type). None = off; metric `actor/z_loss`."""
    attention_dropout: float | None = Field(None, ge=0, lt=1)
    """Dropout on the attention probabilities during the update (verl's `model.override_config.attention_dropout`
    or `override_transformer_config.attention_dropout`). None = the model's config.json (`attention_dropout`, 0
    for Qwen and Llama). Log-prob passes run without dropout."""
    hidden_dropout: float | None = Field(None, ge=0, lt=1)
    """megatron: dropout after the attention and MLP blocks during the update (Megatron's `hidden_dropout`;
    verl's `override_transformer_config.hidden_dropout`). None or 0 = off (Qwen and Llama have none). The torch
    backend's HF models have no such dropout: `validate` refuses a value > 0 there."""
