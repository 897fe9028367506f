"""The torch / FSDP2 trainer's activation terms: what the update keeps from its forward, and the largest moment
on top of it (`engine.plan.memory.trainer_memory` adds them to the rank's resident terms).

Notation as in `engine.plan.memory`, and: T the update micro-batch's tokens on the rank (padded: rows × longest
row — the one place a sequence-parallel split or packed rows would change), T_h = min(`logprob_chunk_tokens`,
the micro-batch's response tokens), b_res the bytes of the residual stream — b_c under FSDP2's
`MixedPrecisionPolicy` (the parameters themselves are cast, so every layer's input is in b_c), b_p on one rank
under autocast (the embedding output stays in the parameters' dtype and the residual adds keep it).

Saved from the forward until the backward needs it:

    recompute (HF per-layer checkpointing)   T·L·h·b_res      each layer keeps only its input
    no recompute                             T·L·a            a calibrated per token and layer
    tail                                     T·c_tail·h·b_c/2 the final norm's saved tensors, the head's input
                                                              (c_tail measured; freed by the head's backward)

The rank's peak is the saved activations plus the largest of three moments:

    head forward    tail + T_h·V·(b_c + 16 + 4·vl): one chunk's logits (b_c), its fp32 tempered logits (4) and
                    log-softmax (4), and the entropy metric every update logs, computed without grad: exp (4)
                    and the product summed (4); a vision-language model's placeholder suppression keeps a masked
                    copy (4) (`engine.trainer.logprobs.token_log_probs`)
    head backward   tail + T_h·V·c_v + V·h·b_c: the recomputed chunk's backward (c_v calibrated) and the output
                    head's unsharded weight gradient in b_c
    layer rebuild   recompute only: T·(a + c_bwd·I·b_c/2) + c_t·(layer params)·b_c + V·h·b_c: one layer's
                    activations rebuilt in the backward and its backward's temporaries (c_bwd measured, per token
                    per unit of MLP width: the MLP's gradients dominate), its weight gradient being accumulated, the
                    output head's gradient (held until the root's reduce-scatter at the end of the backward)

The no-grad log-prob passes (π_prox in decoupled mode, the KL reference) keep nothing: their moment is one
layer's working set of their micro-batch, T_lp·a (an upper bound), or the head without grad,
T_h·V·(b_c + 8 + 4·vl), whichever is larger; it replaces the update's activations where it is larger. The head
figures were checked against `FSDPMemTracker` on fake tensors of the 151,936-token head at 4096 tokens
(12.1, 18.1 and 22.1 bytes per token per vocabulary entry without entropy, with it, and with suppression too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.plan.memory import ModelShape

ENTROPY_BYTES = 16
"""fp32 tempered logits + log-softmax + the entropy's exp and product, per token per vocabulary entry."""
NO_GRAD_HEAD_BYTES = 8
"""fp32 tempered logits + log-softmax of a no-grad head chunk, per token per vocabulary entry."""
SUPPRESS_BYTES = 4
"""A vision-language model's masked fp32 copy (placeholder tokens suppressed)."""


def torch_activation_terms(m: ModelShape, *, tokens: float, head_tokens: float, lp_tokens: float,
                           lp_head_tokens: float, recompute: bool, b_c: int, b_res: int, vision: bool,
                           log_prob_passes: int, cal: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """The activation terms of the module docstring (bytes) and which moment sets the peak."""
    from engine.plan.memory import activation_per_token_layer, layer_params

    c = cal["coefficients"]
    a = activation_per_token_layer(m, b_c, cal)
    saved = tokens * m.layers * (m.hidden * b_res if recompute else a)
    tail = tokens * c["c_tail"] * m.hidden * b_c / 2
    vl = SUPPRESS_BYTES if vision else 0
    head_grad = m.vocab * m.hidden * b_c
    head_fwd = head_tokens * m.vocab * (b_c + ENTROPY_BYTES + vl)
    head_bwd = head_tokens * m.vocab * c["c_v"] + head_grad
    head = max(head_fwd, head_bwd)
    mlp = m.experts_per_token * m.moe_intermediate if m.is_moe else m.intermediate
    rebuilt = tokens * (a + c["c_bwd"] * mlp * b_c / 2)
    rebuild = rebuilt + c["c_t"] * layer_params(m) * b_c + head_grad if recompute else 0.0
    if tail + head >= rebuild:
        moment = "head forward" if head_fwd >= head_bwd else "head backward"
        terms = {"activations": saved, "activation_tail": tail, "logprob_head": head}
    else:
        moment = "layer rebuild"
        terms = {"activations": saved, "layer_rebuild": rebuilt,
                 "backward_transient": c["c_t"] * layer_params(m) * b_c, "head_gradient": head_grad}
    lp = max(lp_tokens * a, lp_head_tokens * m.vocab * (b_c + NO_GRAD_HEAD_BYTES + vl)) if log_prob_passes else 0.0
    details = {"peak_moment": moment, "head_bytes": head, "head_forward_bytes": head_fwd,
               "head_backward_bytes": head_bwd, "layer_rebuild_bytes": rebuild, "log_prob_pass_bytes": lp,
               "residual_bytes": b_res}
    if lp > sum(terms.values()):
        details["peak_moment"] = "log-prob pass"
        terms = {"activations": lp}
    return terms, details
