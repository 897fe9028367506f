"""The sending end of a weight sync: torch tensors → host numpy arrays for transfer buckets."""

from __future__ import annotations

import numpy as np
import torch


def host_array(t: torch.Tensor) -> np.ndarray:
    """`t` as a host numpy array, without a copy when it already is a contiguous CPU tensor numpy can hold.

    The result may therefore *be* the live parameter's memory: it is valid until the next optimizer step.
    That is all a sync needs — the transport copies the bytes out before training goes on (`ray.put` into
    the object store) — and it saves one full copy of the model per sync. A caller that keeps the arrays
    across steps copies them. bfloat16, which numpy lacks, is widened to float32 exactly (a new array);
    a GPU tensor is copied to the host.
    """
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().contiguous().numpy()
