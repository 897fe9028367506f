"""Driver side of the vLLM weight update: flat weight buckets → the workers' `WeightSyncExtension`.

Each bucket is a `engine.sync.flat.FlatBucket` (the model's dtype, one flat buffer and its index): its raw
bytes and index go to every worker inside the RPC (vLLM's multiprocess transport carries bytes, not tensors),
and each worker views its tensors in place (`worker_ext.asyncrl_load_flat`) — no serialisation format,
no file round trip; every engine core of a data-parallel engine gets it (`every_worker`). With the collective
weight sync the buckets bypass the driver: each worker receives the trainer's broadcast itself. Tied-embedding
models always get `lm_head.weight` (= `model.embed_tokens.weight`, added by the worker): vLLM keeps a separately
processed copy of the head, which a bucket without it leaves stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMBED_NAME = "model.embed_tokens.weight"
HEAD_NAME = "lm_head.weight"


def tied_embeddings(model_dir: str | Path) -> bool:
    """`tie_word_embeddings` of the checkpoint's config.json (top level, else its `text_config`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def tie_lm_head(tensors: dict[str, Any], tied: bool) -> dict[str, Any]:
    """`tensors` with `lm_head.weight` added (= the embedding) when the model ties them and the bucket
    carries the embedding but not the head."""
    if tied and EMBED_NAME in tensors and HEAD_NAME not in tensors:
        return {**tensors, HEAD_NAME: tensors[EMBED_NAME]}
    return tensors


async def send_bucket(engine: Any, bucket: Any, tied: bool) -> tuple[int, list[int]]:
    """Feed one bucket (a `FlatBucket`, or a dict of tensors / arrays, packed here) to every worker of `engine`
    (an `AsyncLLM` inside an update session). Returns its payload bytes and, by worker (vLLM's global rank order,
    every node of a replica that spans nodes), the fingerprint of the bytes that worker received."""
    from engine.sync.flat import flatten

    fb = flatten(bucket, device="cpu")
    index = [[name, dtype, list(shape), offset, nbytes] for name, dtype, shape, offset, nbytes in fb.index]
    got = await every_worker(engine, "asyncrl_load_flat", (index, fb.data.numpy().tobytes(), tied))
    return fb.nbytes, [int(g[1]) for g in got]


async def every_worker(engine: Any, method: str, args: tuple = ()) -> list[Any]:
    """`method` of the worker extension on every worker of `engine` (an `AsyncLLM`), their results in replica order:
    engine core by engine core (vLLM's data parallel rank), each core's workers in its global rank order.
    `AsyncLLM.collective_rpc` runs the call on every core of a data-parallel engine but returns the first core's
    results only, so with several cores this asks each one (`call_utility_all_async`, all at once: a collective
    weight sync needs every receiver in the broadcast together)."""
    core = getattr(engine, "engine_core", None)
    cores = getattr(core, "core_engines", None) or []
    if len(cores) > 1 and callable(getattr(core, "call_utility_all_async", None)):
        per_core = await core.call_utility_all_async("collective_rpc", method, None, args, None)
        return [result for results in per_core for result in results]
    return await engine.collective_rpc(method, args=args)
