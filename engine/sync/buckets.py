"""Grouping named weight tensors (or arrays) into transfer buckets of bounded size (no torch import, no Ray)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

Bucket = dict[str, "np.ndarray | Any"]
"""HF parameter name → tensor (a trainer's export, in the model's dtype) or numpy array. The unit a weight sync
groups; the transports move it packed as an `engine.sync.flat.FlatBucket`."""


def bucketize(named_arrays: Iterable[tuple[str, np.ndarray]], bucket_bytes: int) -> Iterator[Bucket]:
    """Greedily pack `(name, array)` pairs, in order, into buckets of at most `bucket_bytes` bytes.

    A bucket is closed as soon as the next array would push it over `bucket_bytes`; an array larger than
    `bucket_bytes` on its own travels alone. Order is preserved, so concatenating the buckets gives back
    the input sequence. `bucket_bytes <= 0` means one bucket for everything.
    """
    current: Bucket = {}
    size = 0
    for name, array in named_arrays:
        if name in current:
            raise ValueError(f"duplicate weight name {name!r}")
        nbytes = int(array.nbytes)
        if current and bucket_bytes > 0 and size + nbytes > bucket_bytes:
            yield current
            current, size = {}, 0
        current[name] = array
        size += nbytes
    if current:
        yield current


def bucket_nbytes(bucket: Bucket) -> int:
    """Total payload bytes of one bucket (sum of `array.nbytes`)."""
    return sum(int(a.nbytes) for a in bucket.values())
