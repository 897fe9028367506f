"""Lending idle trainer devices to rollout on accelerator pools — modelled by `asyncrl plan`, not built.

This is the accelerator analogue of elastic cores (`engine.loop.elastic`, built for `device = "cpu"`): while
the trainer waits for data, its M devices generate as ⌊M / tp⌋ more replicas (tp = the rollout's tensor
parallel size), and are handed back before its next step (as verl's successor trainer and ROLL do). From
the plan's steady window (`engine.predict.prediction.Prediction` of the layout):

    T  = version time                              i = trainer idle ratio (its wait for data over T)
    C  = (1 − i) · T                               the trainer's busy time per version (compute + sync pauses)
    W  = R · slots · T · (1 − rollout idle)        the generation work per version (replica-slot-seconds)
    L  = ⌊M / tp⌋ · slots                          the lent devices as replica slots (R · slots the rollout's own)
    s  = the plan's sync pause per version         each version the lent replicas load the weights once

    generation capacity over a version of length T':   R·slots·T' + L · max(0, T' − C − s) ≥ W
    T' = max(C, W / (R·slots))                            when W / (R·slots) ≤ C + s (nothing left to lend for)
    T' = max(C, (W + L · (C + s)) / (R·slots + L))        otherwise
    predicted gain = T / T'

The gain is an upper bound of the schedule alone: it assumes the lent devices hold the rollout's weights and KV
cache beside the trainer's (offloaded) state, switch in no time beyond the weight load `s`, and that the
trainer's data arrives no later for it (the staleness budget is unchanged). With i = 0 (the trainer never
waits) the gain is 1.
"""

from __future__ import annotations

from typing import Any

from engine.predict.costs import Layout


def lending_gain(layout: Layout, plan: Any) -> dict[str, Any]:
    """The lending term of `layout` from its predicted steady state `plan` (see the module docstring)."""
    slots = max(1, layout.slots)
    T = plan.version_time_s
    i = plan.trainer_idle_ratio
    C = (1.0 - i) * T
    own = layout.replicas * slots
    W = own * T * (1.0 - plan.rollout_idle_ratio)
    L = (layout.trainer_world // max(1, layout.rollout_tp)) * slots
    s = plan.sync_pause_s
    if L == 0 or W / own <= C + s:
        t_new = max(C, W / own)
    else:
        t_new = max(C, (W + L * (C + s)) / (own + L))
    t_new = min(T, t_new) if T > 0 else T
    gain = T / t_new if t_new > 0 else 1.0
    return {
        "built": False,
        "lendable_replicas": layout.trainer_world // max(1, layout.rollout_tp),
        "trainer_idle_ratio": i,
        "version_time_s": T,
        "predicted_version_time_s": t_new,
        "predicted_gain": gain,
        "formula": "T' = max(C, (W + L·(C + s)) / (R·slots + L)); gain = T / T'  (C = (1 − i)·T, "
                   "W = R·slots·T·(1 − rollout idle), L = ⌊M / tp⌋·slots, s = sync pause)",
    }
