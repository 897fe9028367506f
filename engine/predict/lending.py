"""Lending idle trainer devices to rollout on accelerator pools — modelled by `asyncrl plan`, not built.

This is the accelerator analogue of elastic cores (`engine.loop.elastic`, built for `device = "cpu"`): while
the trainer waits for data, its M devices generate as ⌊M / tp⌋ more replicas (tp = the rollout's tensor
parallel size), and are handed back before its next step (as verl's successor trainer and ROLL do). From
the plan's steady window (`engine.predict.prediction.Prediction` of the layout):

    T  = version time                        i = trainer idle ratio (its wait for data over T)
    C  = (1 − i) · T                         the trainer's busy time per version (compute + sync pauses)
    w  = i · T                               the trainer's wait per version
    u  = 1 − rollout idle ratio              the share of the rollout's slots busy (taken as uniform over T)
    own = R · slots                          the rollout's own slots;  L = ⌊M / tp⌋ · slots the lent ones
    s  = the plan's sync pause per version   the lent replicas load the current weights once per version

    T' = min(T, C + s + w · ((1 − u) + u · own / (own + L)))        predicted gain = T / T'

Amdahl's rule over the trainer's wait: only its throughput-bound part (the rollout's busy share u) runs on
own + L slots; the rest (a long-tail response, the staleness budget, a sync) does not shorten with more devices.
Lending is worth it only when the wait saved exceeds the weight load `s` (else T' = T, gain 1). An upper bound of
the schedule: the lent devices must hold the rollout's weights and KV cache beside the trainer's (offloaded)
state and switch back at once; the staleness budget is unchanged. With i = 0 (the trainer never waits) the gain
is 1.
"""

from __future__ import annotations

from typing import Any

from engine.predict.costs import Layout


def lending_gain(layout: Layout, plan: Any) -> dict[str, Any]:
    """The lending term of `layout` from its predicted steady state `plan` (see the module docstring)."""
    slots = max(1, layout.slots)
    T = plan.version_time_s
    i = plan.trainer_idle_ratio
    C, w = (1.0 - i) * T, i * T
    u = max(0.0, min(1.0, 1.0 - plan.rollout_idle_ratio))
    own = layout.replicas * slots
    lent = layout.trainer_world // max(1, layout.replica_gpus)
    L = lent * slots
    t_new = min(T, C + plan.sync_pause_s + w * ((1.0 - u) + u * own / (own + L))) if L else T
    return {
        "built": False,
        "lendable_replicas": lent,
        "trainer_idle_ratio": i,
        "rollout_busy_share": u,
        "version_time_s": T,
        "predicted_version_time_s": t_new,
        "predicted_gain": T / t_new if t_new > 0 else 1.0,
        "formula": "T' = min(T, C + s + w·((1 − u) + u·own / (own + L))); gain = T / T'  (C = (1 − i)·T, "
                   "w = i·T, u = 1 − rollout idle, own = R·slots, L = ⌊M / tp⌋·slots, s = sync pause)",
    }
