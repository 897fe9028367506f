"""Driver side of the vLLM weight update: HF-named numpy buckets → the workers' `WeightSyncExtension`.

Each bucket is serialised with safetensors and handed to every worker either as bytes inside the RPC or
as a file in /dev/shm (one copy in shared memory instead of one pickled copy per worker message); the
file is used only when /dev/shm has room for twice the bucket. Tied-embedding models always get
`lm_head.weight` (= `model.embed_tokens.weight`): vLLM keeps a separately processed copy of the head,
which a bucket without it leaves stale.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np

WeightTransport = Literal["bytes", "file"]

EMBED_NAME = "model.embed_tokens.weight"
HEAD_NAME = "lm_head.weight"
SHM_DIR = "/dev/shm"


def tied_embeddings(model_dir: str | Path) -> bool:
    """`tie_word_embeddings` of the checkpoint's config.json (top level, else its `text_config`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def tie_lm_head(bucket: dict[str, np.ndarray], tied: bool) -> dict[str, np.ndarray]:
    """`bucket` with `lm_head.weight` added (= the embedding) when the model ties them and the bucket
    carries the embedding but not the head."""
    if tied and EMBED_NAME in bucket and HEAD_NAME not in bucket:
        return {**bucket, HEAD_NAME: bucket[EMBED_NAME]}
    return bucket


def default_transport() -> WeightTransport:
    return "file" if os.path.isdir(SHM_DIR) else "bytes"


async def send_bucket(engine: Any, bucket: dict[str, np.ndarray], transport: WeightTransport) -> int:
    """Feed one bucket to every worker of `engine` (an `AsyncLLM` inside an update session) and return
    its size in bytes. Read-only arrays (zero-copy views of Ray's object store) are fine: only read."""
    from safetensors.numpy import save, save_file

    arrays = {name: np.ascontiguousarray(a) for name, a in bucket.items()}
    nbytes = sum(a.nbytes for a in arrays.values())
    if transport == "bytes" or shutil.disk_usage(SHM_DIR).free < 2 * nbytes:
        await engine.collective_rpc("asyncrl_load_bytes", args=(save(arrays),))
        return nbytes
    fd, path = tempfile.mkstemp(prefix="asyncrl-weights-", suffix=".safetensors", dir=SHM_DIR)
    os.close(fd)
    try:
        save_file(arrays, path)
        await engine.collective_rpc("asyncrl_load_file", args=(path,))
    finally:
        os.remove(path)
    return nbytes
