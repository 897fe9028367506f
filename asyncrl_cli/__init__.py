"""asyncrl's user surface: the `asyncrl` command line, the run-config schema and the dashboard.

Nothing here imports torch, ray, vllm or transformers at import time; the engine is imported lazily.
"""
