"""The formulas the studies report (pure functions of measured numbers)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def ideal_speedup(t_gen: float, t_train: float) -> float:
    """The best an overlap of generation and training can do over strict alternation:

        ideal = (T_gen + T_train) / max(T_gen, T_train)

    with T_gen, T_train the phase times measured in the sync run (1 ≤ ideal ≤ 2)."""
    longest = max(t_gen, t_train)
    if longest <= 0:
        raise ValueError("phase times must not both be zero")
    return (t_gen + t_train) / longest


def overlap_efficiency(achieved: float, ideal: float) -> float:
    """achieved speedup ÷ ideal speedup (1.0 = the overlap hides the shorter phase completely)."""
    return achieved / ideal


def final_stats(
    values: Sequence[float], tail_fraction: float = 0.2, min_points: int = 3
) -> tuple[float, float]:
    """(mean, standard error) of the last `tail_fraction` of a curve (at least `min_points` points):
    mean = Σ v_i / k, se = stdev(v) / √k over those k points (se = 0 for one point)."""
    if not values:
        raise ValueError("empty curve")
    k = min(len(values), max(min_points, math.ceil(tail_fraction * len(values))))
    tail = list(values)[-k:]
    mean = statistics.fmean(tail)
    se = statistics.stdev(tail) / math.sqrt(k) if k > 1 else 0.0
    return mean, se


def within_noise(mean_a: float, se_a: float, mean_b: float, se_b: float, z: float = 2.0) -> bool:
    """|mean_a − mean_b| ≤ z · √(se_a² + se_b²): the two final rewards are indistinguishable at ~95 %."""
    return abs(mean_a - mean_b) <= z * math.sqrt(se_a**2 + se_b**2)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def gb_per_s(nbytes: float, seconds: float) -> float:
    """Bandwidth in GB/s (10⁹ bytes per second)."""
    return float(nbytes) / seconds / 1e9 if seconds > 0 else float("inf")
