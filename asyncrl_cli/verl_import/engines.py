"""A verl script's rollout engine that asyncrl has no backend for (TensorRT-LLM, SGLang), and what
`asyncrl import verl --rollout-engine vllm` does with it.

asyncrl's replicas run vLLM (or asyncrl's own sampler). A script whose `actor_rollout_ref.rollout.name` is
trtllm or sglang is refused unless the user consents to run it on vLLM instead (`--rollout-engine vllm`). What
stays the same: the sampling distribution verl asks every engine for (softmax at `temperature`, then `top_p`,
`top_k`; verl passes the same sampling parameters to each), the rollout log-probs returned with the tokens, the
lengths. What may differ: the kernels and numerics of the forward pass and the sampler (bf16 attention / GEMM
kernels, the sampler's top-p / top-k implementation), so π_rollout is vLLM's, not the replaced engine's — the
rollout-correction diagnostics (`rollout_corr/kl`, `rollout_corr/ppl_ratio`; `asyncrl/mismatch/kl` on the rows
sampled at the trainer's weights) measure the gap between vLLM and the trainer, which is what rollout correction
corrects; and each engine's own stop rules (`STOP_RULES`). The substitution is written at the top of the run file,
on the `rollout.backend` key, and printed as a warning (`Conversion.warnings`).

Keys that configure one engine (`rollout.engine_kwargs.<engine>.*`) are accounted for key by key
(`ENGINE_KWARGS`), whether or not the engine is substituted: mapped to the asyncrl key that means the same (the
engine's keyword wins over the core key, as in verl, where it is unpacked last), dropped with the reason (speed and
memory only), or, when the importer does not know the key, an error (it may change sampling or precision). Core
rollout keys an engine reads differently are noted (`READ_DIFFERENTLY`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asyncrl_cli.verl_import.values import ROLL, to_int, to_str

if TYPE_CHECKING:
    from asyncrl_cli.verl_import.convert import Conversion

ENGINES = {"trtllm": "TensorRT-LLM", "sglang": "SGLang"}
"""verl's rollout engines asyncrl has no backend for, by `rollout.name`."""
SUBSTITUTES = ("vllm",)
"""What `--rollout-engine` may name: the engine asyncrl runs in their place."""

ENGINE_KWARGS: dict[str, dict[str, tuple[tuple[str, Callable[[str], Any]] | None, str]]] = {
    "trtllm": {
        "batch_wait_timeout_iters": (None, "TensorRT-LLM's scheduler waits up to this many iterations for a "
                                           "context batch to fill before it runs it: scheduling, speed only "
                                           "(vLLM's scheduler has no such wait)"),
        "batch_wait_max_tokens_ratio": (None, "the share of TensorRT-LLM's max_num_tokens that ends that wait: "
                                              "scheduling, speed only"),
    },
    "sglang": {
        "max_running_requests": (("rollout.max_num_seqs", to_int),
                                 "SGLang's cap on the requests a server runs at once, vLLM's max_num_seqs"),
        "mamba_scheduler_strategy": (None, "how SGLang caches a hybrid model's linear-attention (Mamba) states "
                                           "between requests: speed and memory only"),
        "disable_radix_cache": (None, "SGLang's prefix (radix) cache: speed only (vLLM's prefix cache is too)"),
        "enable_memory_saver": (None, "SGLang releasing its memory during weight syncs: memory placement only "
                                      "(asyncrl's vLLM replicas sleep during a sync on CUDA)"),
        "enable_weights_cpu_backup": (None, "a host copy of SGLang's weights while it sleeps: memory placement "
                                            "only"),
        "enable_draft_weights_cpu_backup": (None, "a host copy of SGLang's draft-model weights while it sleeps: "
                                                  "memory placement only"),
        "disable_overlap_schedule": (None, "SGLang overlapping its CPU scheduling with the GPU: speed only"),
        "cuda_graph_max_bs": (None, "the largest batch SGLang captures as a CUDA graph: speed only"),
        "disable_cuda_graph": (None, "SGLang's CUDA graphs: speed only"),
    },
}
"""`rollout.engine_kwargs.<engine>.<key>` → (the asyncrl key and converter of the same meaning, or None: dropped),
the reason. Read from verl 1dda039's `trtllm_async_server.py` / `async_sglang_server.py` (the kwargs are unpacked
into the engine's arguments last) and the engines' documentation."""

READ_DIFFERENTLY: dict[str, dict[str, str]] = {
    "trtllm": {
        "gpu_memory_utilization": "TensorRT-LLM reads rollout.gpu_memory_utilization as the share of the memory "
                                  "left after the weights that its KV cache takes (free_gpu_memory_fraction); "
                                  "vLLM reads it as the share of the device for weights and KV cache together: "
                                  "memory placement only (validate checks the fit)",
    },
}
"""Core rollout keys (`actor_rollout_ref.rollout.<key>`) an engine reads with another meaning than vLLM: noted."""

STOP_RULES: dict[str, str] = {
    "trtllm": "stop tokens: TensorRT-LLM in verl also stops on a chat-end token the tokenizer has "
              "(<|im_end|>, <|eot_id|>, <|end_of_turn|>); vLLM stops on the tokenizer's EOS and "
              "generation_config.json's eos_token_id. For a base model whose generation_config names only "
              "<|endoftext|> (Qwen3-Base), add the chat-end id to eos_token_id there to stop where TensorRT-LLM did",
}
"""Where an engine's stopping differs from vLLM's, written into the warning (SGLang's, like vLLM's, is the
tokenizer's EOS and generation_config.json's eos_token_id)."""


def take_engine_kwargs(raw: dict[str, str]) -> dict[str, str]:
    """The `rollout.engine_kwargs.trtllm.*` / `.sglang.*` overrides, popped from `raw` (accounted for by
    `account`, after the other keys, so that an engine keyword wins over the core key it replaces)."""
    prefixes = tuple(f"{ROLL}.engine_kwargs.{engine}." for engine in ENGINE_KWARGS)
    return {key: raw.pop(key) for key in [k for k in raw if k.startswith(prefixes)]}


def rollout_engine(conv: Conversion, raw: dict[str, str], substitute: str | None) -> str | None:
    """`rollout.name` = trtllm / sglang (popped from `raw`): an error whose message names `--rollout-engine`,
    or, with `substitute`, `rollout.backend` = vLLM. Returns the engine the script names (None: verl's default)."""
    value = raw.get(f"{ROLL}.name")
    engine = to_str(value) if value is not None else None
    if engine not in ENGINES:
        return engine
    ov = f"{ROLL}.name={raw.pop(f'{ROLL}.name')}"
    if substitute is None:
        conv.errors.append((ov, f"{ENGINES[engine]} (rollout.name={engine}) is not an asyncrl rollout backend: "
                                "pass --rollout-engine vllm "
                                "to run the script on vLLM instead (the same sampling, vLLM's kernels and numerics; "
                                "the substitution is written into the file)"))
    else:
        conv.values["rollout.backend"] = substitute
        conv.sources["rollout.backend"] = f"{ov}, replaced by vLLM (--rollout-engine {substitute}: see the top)"
    return engine


def account(conv: Conversion, kwargs: dict[str, str], engine: str | None, substitute: str | None) -> None:
    """Account for every engine keyword of `kwargs` (`ENGINE_KWARGS`) and, when `engine` was replaced by
    `substitute`, write the substitution's warning: what stays, what may differ, what was dropped."""
    for key, value in kwargs.items():
        owner, _, leaf = key.removeprefix(f"{ROLL}.engine_kwargs.").partition(".")
        ov, label = f"{key}={value}", ENGINES[owner]
        mapped, why = ENGINE_KWARGS[owner].get(leaf, (None, ""))
        if owner != engine:
            conv.ignored.append((ov, f"configures {label}, which the script does not run"))
        elif not why:
            conv.errors.append((ov, f"a {label} engine setting the importer does not know: it may change "
                                    "sampling or precision"))
        elif mapped is None:
            conv.ignored.append((ov, why))
        else:
            target, fn = mapped
            try:
                converted = fn(value)
            except ValueError as e:
                conv.errors.append((ov, str(e)))
                continue
            if target in conv.sources:
                conv.ignored.append((conv.sources[target], f"{key} wins over it, in verl as here"))
            conv.values[target], conv.sources[target] = converted, f"{ov} ({why})"
    if engine not in ENGINES or substitute is None:
        return
    label = ENGINES[engine]
    known = ENGINE_KWARGS[engine]
    prefix = f"{ROLL}.engine_kwargs.{engine}."
    leaves = [key.removeprefix(prefix) for key in kwargs if key.startswith(prefix)]
    dropped = [leaf for leaf in leaves if leaf in known and known[leaf][0] is None]
    conv.warnings += [
        f"rollout engine: {label} (rollout.name={engine}) replaced by vLLM, as --rollout-engine {substitute} asked; "
        "the sampling is the script's (temperature, top-p, top-k, n and lengths as it sets them)",
        f"may differ: the kernels and numerics of the forward pass and of the sampler, so π_rollout is vLLM's, not "
        f"{label}'s; rollout_corr/kl, rollout_corr/ppl_ratio and asyncrl/mismatch/kl measure the gap between vLLM "
        "and the trainer (what rollout correction corrects)",
        *([f"may differ: {STOP_RULES[engine]}"] if engine in STOP_RULES else []),
        *(f"may differ: {why}" for why in READ_DIFFERENTLY.get(engine, {}).values()),
        *([f"dropped {label} settings (speed and memory only; each with its reason at the end of the file): "
           + ", ".join(dropped)] if dropped else []),
    ]
