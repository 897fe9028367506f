"""The `hf` rollout engine: generation with the transformers model in the replica's own process.

    backend.py     `HFRolloutBackend` (the replica's engine: generate, pause, load weights)
    continuous.py  the continuous batcher (rows join and leave between decode steps)
    decode.py      one forward over a batch of rows (text and multimodal), left padding
    kv_cache.py    the KV cache of the continuous batcher (merging rows' caches)
    sampling.py    token selection (temperature, top-k, top-p) with the chosen token's log-prob
    keyed.py       deterministic mode: keyed draws and one group alone, fixed shapes
"""
