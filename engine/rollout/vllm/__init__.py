"""The `vllm` rollout engine: a vLLM AsyncLLM inside the replica (vLLM is imported only inside these modules).

    backend.py        `VLLMRolloutBackend` (generate, pause/resume, weight loading)
    engine_args.py    the engine arguments of one replica on its device; the EOS ids it stops on
    requests.py       one request in flight, request checks, the image-placeholder collapse
    compat.py         what the installed vLLM release supports (keep-pause, layer-wise reload)
    loop_thread.py    the asyncio loop thread the backend drives vLLM from
    selftest.py       the resume-continuity self-test (an abort or keep-pause loses no token)
    weights.py        a flat bucket's bytes to the workers; tied embeddings
    worker_ext.py     the worker extension that loads buckets in place (collective or RPC)
    legacy_reload.py  in-place reload for releases without the layer-wise reload
"""
