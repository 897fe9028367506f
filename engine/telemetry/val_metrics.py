"""Validation metrics at n answers per prompt, as verl computes and names them.

Reproduces the semantics of verl's `process_validation_metrics`, `bootstrap_metric` and `calc_maj_val`
(verl/trainer/ppo/metric_utils.py) and the val-core / val-aux split of `RayPPOTrainer._val_metrics_update`
(verl/trainer/ppo/ray_trainer.py), written anew over numpy.

Input: one entry per answer — its prompt uid, its data source, its numeric variables (`reward` = the score, and
the reward's numeric info such as `acc`) and, when the reward reports one, `pred` (the extracted answer, a
string, the vote of majority voting). Per data source, per prompt u with answers 1..n and per variable x:

- `mean@n` = (1/n) Σ_i x_i;  `std@n` = sqrt((1/n) Σ_i (x_i − mean)²)  (population std, n > 1 only);
- for every k in K(n) = {2, 4, 8, … < n} ∪ {n} (n > 1), B = 1000 bootstrap draws j, each k answer indices
  I_j drawn uniformly with replacement from 1..n:
  `best@k/mean` = mean_j max_{i∈I_j} x_i and `best@k/std` = std_j of the same (population std);
  `worst@k/*` the same with min; `maj@k/*` (only when every answer has `pred`) the same with
  maj(I_j) = x of the first answer in I_j (in draw order) whose `pred` is the most frequent in I_j, ties going
  to the `pred` seen first in I_j.

  The draws are verl's bit for bit: verl reseeds numpy's legacy generator with 42 before each
  `bootstrap_metric` call and draws `choice(n, size=k, replace=True)` B times, so the indices depend only on
  (n, k) — the same for best, worst and maj, for every variable and every prompt; here they are drawn once
  per (n, k) from `RandomState(42)`, the same stream.

Each metric is then averaged over the source's prompts (prompts with another answer count form their own
names, as in verl). Sections: the core variable is `acc` when the source reports it, else `reward`; a metric
of the core variable goes to `val-core/<source>/<var>/<metric>` when it starts with `mean`, `maj` or `best` and
its k is the largest of the variable (n), everything else to `val-aux/<source>/<var>/<metric>`. At n = 1 that
is `val-core/<source>/acc/mean@1` and `val-aux/<source>/<var>/mean@1`, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_SEED = 42
CORE_PREFIXES = ("mean", "maj", "best")


@dataclass(frozen=True)
class Answer:
    """One scored validation answer."""

    uid: str
    data_source: str
    values: dict[str, float]
    """Numeric variables: `reward` (the score) and the reward's numeric info (e.g. `acc`)."""
    pred: str | None = None
    """The extracted answer (the reward info's `pred`), the vote of `maj@k`; None = no majority voting."""


def subset_sizes(n: int) -> list[int]:
    """K(n): 2, 4, 8, … below n, then n itself (verl's sizes); empty for n = 1."""
    if n <= 1:
        return []
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


@lru_cache(maxsize=64)
def bootstrap_indices(n: int, k: int, draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[draws, k] answer indices: `draws` successive `choice(n, size=k, replace=True)` of a legacy numpy
    generator seeded with `seed` (the stream verl's `bootstrap_metric` draws from)."""
    rs = np.random.RandomState(seed)
    out = np.stack([rs.choice(n, size=k, replace=True) for _ in range(draws)])
    out.setflags(write=False)
    return out


def majority_value(values: Sequence[float], preds: Sequence[str]) -> float:
    """The value of the first answer whose `pred` is the most frequent (ties: the `pred` seen first)."""
    counts: dict[str, int] = {}
    first: dict[str, float] = {}
    for v, p in zip(values, preds, strict=True):
        counts[p] = counts.get(p, 0) + 1
        first.setdefault(p, v)
    top = max(counts.values())
    return next(first[p] for p, c in counts.items() if c == top)


def prompt_metrics(values: Sequence[float], preds: Sequence[str] | None = None) -> dict[str, float]:
    """The metrics of one prompt's variable over its n answers (module docstring); `preds` enables maj@k."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    out = {f"mean@{n}": float(x.mean())}
    if n == 1:
        return out
    out[f"std@{n}"] = float(x.std())
    for k in subset_sizes(n):
        idx = bootstrap_indices(n, k)
        sub = x[idx]
        best, worst = sub.max(axis=1), sub.min(axis=1)
        out[f"best@{k}/mean"], out[f"best@{k}/std"] = float(best.mean()), float(best.std())
        out[f"worst@{k}/mean"], out[f"worst@{k}/std"] = float(worst.mean()), float(worst.std())
        if preds is not None:
            maj = np.array([majority_value(x[row].tolist(), [preds[i] for i in row]) for row in idx])
            out[f"maj@{k}/mean"], out[f"maj@{k}/std"] = float(maj.mean()), float(maj.std())
    return out


def _k_of(metric: str) -> int:
    """The answer count of a metric name: 4 for `mean@4`, `best@4/std`."""
    return int(metric.split("@", 1)[1].split("/", 1)[0])


@dataclass
class _Group:
    values: dict[str, list[float]] = field(default_factory=dict)
    preds: list[str | None] = field(default_factory=list)


def validation_metrics(answers: Sequence[Answer]) -> dict[str, float]:
    """`val-core/…` and `val-aux/…` metrics of `answers` (module docstring), per data source in order of
    first appearance."""
    groups: dict[str, dict[str, _Group]] = {}
    for a in answers:
        g = groups.setdefault(a.data_source, {}).setdefault(a.uid, _Group())
        for var, v in a.values.items():
            g.values.setdefault(var, []).append(float(v))
        g.preds.append(a.pred)
    out: dict[str, float] = {}
    for src, by_uid in groups.items():
        per_metric: dict[str, dict[str, list[float]]] = {}
        for g in by_uid.values():
            preds = g.preds if all(p is not None for p in g.preds) else None
            for var, vals in g.values.items():
                use = preds if preds is not None and len(preds) == len(vals) else None
                for name, v in prompt_metrics(vals, use).items():  # type: ignore[arg-type]
                    per_metric.setdefault(var, {}).setdefault(name, []).append(v)
        core = "acc" if "acc" in per_metric else "reward"
        for var, metrics in per_metric.items():
            n_max = max(_k_of(name) for name in metrics)
            for name, vals in metrics.items():
                is_core = var == core and name.startswith(CORE_PREFIXES) and _k_of(name) == n_max
                out[f"{'val-core' if is_core else 'val-aux'}/{src}/{var}/{name}"] = float(np.mean(vals))
    return out
