"""Grouping named weight arrays into transfer buckets of bounded size (pure numpy, no torch, no Ray)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

Bucket = dict[str, np.ndarray]
"""HF parameter name → array. The unit a weight sync moves at once."""


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
