"""verl Hydra overrides → asyncrl keys, as a contract: every override is accounted for.

The overrides are read from the `python -m verl…` command line (named blocks such as `$DATA_CONFIG` …
`$ASYNC_CONFIG` and arrays `"${arr[@]}"` expand into it), with the `n_gpus_rollout` / `n_gpus_training` /
`n_nodes_*` (and older `NNODES_*` / `NGPUS_PER_NODE`) variables as a fallback for the resource keys. Every
override lands in exactly one of three lists:

- mapped: the asyncrl key with the value verl would use (`MAP`; `REQUIRED` / `SAME_AS` values asyncrl honours
  without a key of its own are listed as ignored with their reason);
- ignored: no effect on the experiment (speed, memory placement, logging, paths), with the reason (`IGNORED`,
  `IGNORED_PREFIXES`);
- errors: the key changes the experiment and asyncrl cannot honour it (`REFUSED_PREFIXES`, a `REQUIRED` key with
  another value, a converter that refuses the value, a removed or unknown key). Any error stops the conversion
  (`asyncrl import verl` exits 1 and lists every one).

verl's defaults are filled where asyncrl's differ (`VERL_DEFAULTS`, and `data.image_key = "images"` for a
vision-language model). What the shell reader assumed (a positional default) is a note; what it could not
resolve (a bare `$1`, an unknown array) is an error, never dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config.rc_config import LEGACY_RS, invert_band
from asyncrl_cli.verl_import.shell import Script, concrete, parse_script

AR = "actor_rollout_ref"
ACTOR = f"{AR}.actor"
ROLL = f"{AR}.rollout"
RC = "algorithm.rollout_correction"


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def to_bool(v: str) -> bool:
    """Hydra booleans."""
    s = concrete(_unquote(v)).lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def to_int(v: str) -> int:
    """Hydra ints (symbolic env defaults use their default): a whole, finite number (`1e3` is 1000)."""
    x = to_float(v)
    if x != int(x):
        raise ValueError(f"not a whole number: {v!r}")
    return int(x)


def to_float(v: str) -> float:
    """Hydra floats: finite ones (`1e999`, `inf` and `nan` are refused)."""
    x = float(concrete(_unquote(v)))
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {v!r}")
    return x


def to_str(v: str) -> str:
    """A string, keeping `${ENV:-default}` overrides."""
    return _unquote(v)


def to_list(v: str) -> list[str]:
    """`['a','b']`, `[a,b]` or a single value → list of strings."""
    s = _unquote(v)
    if s.startswith("[") and s.endswith("]"):
        return [_unquote(x) for x in s[1:-1].split(",") if x.strip()]
    return [s]


def to_threshold(v: str) -> float | str:
    """A float, or a `"lower_upper"` spec kept as a string."""
    s = _unquote(concrete(v)) if "$" in v else _unquote(v)
    try:
        x = float(s)
    except ValueError:
        return s
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {v!r}")
    return x


def to_top_k(v: str) -> int:
    """verl's −1 (off, vLLM) → asyncrl's 0 (off)."""
    return max(0, to_int(v))


def to_sinks(v: str) -> list[str]:
    """`trainer.logger` → sinks (jsonl always first; unknown loggers dropped)."""
    known = ("console", "tensorboard", "wandb")
    return ["jsonl", *[x for x in to_list(v) if x in known]]


def to_every(v: str) -> int:
    """`save_freq` (−1 = never) → `every_versions` (0 = only at the end)."""
    return max(0, to_int(v))


def to_backend(v: str) -> str:
    """fsdp/fsdp2 → torch, megatron → megatron."""
    s = to_str(v)
    if s in ("fsdp", "fsdp2"):
        return "torch"
    if s == "megatron":
        return "megatron"
    raise ValueError(f"no asyncrl trainer backend for strategy {s!r}")


def one_of(allowed: tuple[str, ...], refusal: str) -> Callable[[str], str]:
    """A string converter that keeps a value in `allowed`; any other is refused (`refusal`, formatted with the
    value as `{s!r}`)."""

    def inner(v: str) -> str:
        s = to_str(v)
        if s not in allowed:
            raise ValueError(refusal.format(s=s))
        return s

    return inner


to_rollout_backend = one_of(("vllm",), "no asyncrl rollout backend for {s!r} (vllm or hf)")
"""vllm → vllm (sglang/trtllm have no asyncrl backend)."""
to_reward_manager = one_of(("naive", "dapo"), "reward manager {s!r} is not in asyncrl (naive or dapo)")
"""verl's reward managers asyncrl has: `naive` (the score) and `dapo` (the score + the overlong buffer)."""
to_tool_format = one_of(("hermes",), "tool-call format {s!r} is not in asyncrl (hermes)")
"""verl's `multi_turn.format`: asyncrl parses `hermes` tool calls (`<tool_call>{json}</tool_call>`)."""


def to_attn_implementation(v: str) -> str:
    """transformers' `attn_implementation`: sdpa / eager kept; flash_attention_2/3 → sdpa (the same attention,
    which runs flash kernels on GPU through `scaled_dot_product_attention`)."""
    s = to_str(v)
    if s in ("sdpa", "eager"):
        return s
    if s in ("flash_attention_2", "flash_attention_3"):
        return "sdpa"
    raise ValueError(f"attention implementation {s!r} is not in asyncrl (sdpa, eager, or flash_attention_2 → sdpa)")


def to_tool_config(v: str) -> str:
    """verl's `tool_config_path`, kept as written. When the file is at hand (relative paths from the directory
    the import runs in, as verl's scripts run from verl's root) its tools must be ones asyncrl runs
    (`engine.agent.tools.from_verl_yaml` refuses a custom tool class); else `asyncrl validate` checks it."""
    from pathlib import Path

    s = to_str(v)
    if "$" not in s and Path(s).is_file():
        from engine.agent.tools import from_verl_yaml

        from_verl_yaml(s)  # its ValueError names every tool asyncrl cannot run
    return s


def to_optional(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """`null` → None (the key is left out)."""

    def inner(v: str) -> Any:
        return None if _unquote(v) in ("null", "None", "~") else conv(v)

    return inner


MAP: dict[str, tuple[str, Callable[[str], Any]]] = {
    "data.train_files": ("data.train_files", to_list),
    "data.val_files": ("data.val_files", to_list),
    "data.max_prompt_length": ("data.max_prompt_length", to_int),
    "data.max_response_length": ("data.max_response_length", to_int),
    "data.prompt_key": ("data.prompt_key", to_str),
    "data.image_key": ("data.image_key", to_str),
    "data.filter_overlong_prompts": ("data.filter_overlong_prompts", to_bool),
    "data.shuffle": ("data.shuffle", to_bool),
    "data.seed": ("data.seed", to_int),
    f"{AR}.model.path": ("model.path", to_str),
    f"{AR}.model.trust_remote_code": ("model.trust_remote_code", to_bool),
    f"{AR}.model.enable_gradient_checkpointing": ("trainer.enable_gradient_checkpointing", to_bool),
    f"{ACTOR}.strategy": ("trainer.backend", to_backend),
    f"{ACTOR}.fsdp_config.strategy": ("trainer.backend", to_backend),
    f"{ACTOR}.megatron.tensor_model_parallel_size": ("trainer.tp", to_int),
    f"{ACTOR}.megatron.pipeline_model_parallel_size": ("trainer.pp", to_int),
    f"{ACTOR}.megatron.context_parallel_size": ("trainer.cp", to_int),
    f"{ACTOR}.megatron.expert_model_parallel_size": ("trainer.ep", to_int),
    f"{ACTOR}.megatron.expert_tensor_parallel_size": ("trainer.etp", to_int),
    f"{ACTOR}.megatron.override_transformer_config.recompute_granularity": ("trainer.recompute_granularity", to_str),
    f"{ACTOR}.megatron.override_transformer_config.recompute_method": ("trainer.recompute_method", to_str),
    f"{ACTOR}.megatron.override_transformer_config.recompute_num_layers": ("trainer.recompute_num_layers", to_int),
    f"{AR}.ref.megatron.param_offload": ("trainer.ref_param_offload", to_bool),
    f"{AR}.ref.fsdp_config.param_offload": ("trainer.ref_param_offload", to_bool),
    f"{ACTOR}.optim.lr": ("trainer.optim.lr", to_float),
    f"{ACTOR}.optim.lr_warmup_steps": ("trainer.optim.warmup_steps", lambda v: max(0, to_int(v))),
    f"{ACTOR}.optim.weight_decay": ("trainer.optim.weight_decay", to_float),
    f"{ACTOR}.optim.betas": ("trainer.optim.betas", lambda v: [to_float(x) for x in to_list(v)]),
    f"{ACTOR}.grad_clip": ("trainer.grad_clip", to_float),
    f"{ACTOR}.ppo_mini_batch_size": ("trainer.ppo_mini_batch_size", to_int),
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": ("trainer.ppo_micro_batch_size_per_gpu", to_int),
    f"{ACTOR}.use_dynamic_bsz": ("trainer.use_dynamic_bsz", to_bool),
    f"{AR}.model.override_config.attn_implementation": ("trainer.attn_implementation", to_attn_implementation),
    f"{ACTOR}.ppo_max_token_len_per_gpu": ("trainer.ppo_max_token_len_per_gpu", to_int),
    f"{AR}.ref.log_prob_max_token_len_per_gpu": ("trainer.log_prob_max_token_len_per_gpu", to_int),
    f"{ROLL}.log_prob_max_token_len_per_gpu": ("trainer.log_prob_max_token_len_per_gpu", to_int),
    f"{ACTOR}.ppo_epochs": ("trainer.ppo_epochs", to_int),
    f"{ACTOR}.shuffle": ("trainer.shuffle", to_bool),
    f"{ACTOR}.clip_ratio_low": ("trainer.clip_ratio_low", to_float),
    f"{ACTOR}.clip_ratio_high": ("trainer.clip_ratio_high", to_float),
    f"{ACTOR}.clip_ratio_c": ("trainer.clip_ratio_c", to_float),
    f"{ACTOR}.loss_agg_mode": ("trainer.loss_agg_mode", to_str),
    f"{ACTOR}.use_kl_loss": ("trainer.use_kl_loss", to_bool),
    f"{ACTOR}.kl_loss_coef": ("trainer.kl_loss_coef", to_float),
    f"{ACTOR}.kl_loss_type": ("trainer.kl_loss_type", to_str),
    f"{ACTOR}.entropy_coeff": ("trainer.entropy_coeff", to_float),
    f"{ROLL}.name": ("rollout.backend", to_rollout_backend),
    f"{ROLL}.n": ("rollout.n", to_int),
    f"{ROLL}.temperature": ("rollout.temperature", to_float),
    f"{ROLL}.top_p": ("rollout.top_p", to_float),
    f"{ROLL}.top_k": ("rollout.top_k", to_top_k),
    f"{ROLL}.tensor_model_parallel_size": ("rollout.tensor_parallel_size", to_int),
    f"{ROLL}.gpu_memory_utilization": ("rollout.gpu_memory_utilization", to_float),
    f"{ROLL}.max_num_seqs": ("rollout.max_num_seqs", to_int),
    f"{ROLL}.update_weights_bucket_megabytes": ("rollout.weight_sync_bucket_mb", to_int),
    f"{ROLL}.checkpoint_engine.update_weights_bucket_megabytes": ("rollout.weight_sync_bucket_mb", to_int),
    f"{ROLL}.val_kwargs.temperature": ("rollout.val_temperature", to_float),
    f"{ROLL}.val_kwargs.top_p": ("rollout.val_top_p", to_float),
    f"{ROLL}.val_kwargs.top_k": ("rollout.val_top_k", to_top_k),
    "algorithm.adv_estimator": ("algorithm.adv_estimator", to_str),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.norm_adv_by_std_in_grpo", to_bool),
    "algorithm.filter_groups.enable": ("algorithm.filter_groups.enable", to_bool),
    "algorithm.filter_groups.metric": ("algorithm.filter_groups.metric", to_str),
    f"{RC}.rollout_is": (f"{RC}.rollout_is", to_optional(to_str)),
    f"{RC}.rollout_is_threshold": (f"{RC}.rollout_is_threshold", to_threshold),
    f"{RC}.rollout_is_batch_normalize": (f"{RC}.rollout_is_batch_normalize", to_bool),
    f"{RC}.rollout_rs_threshold": (f"{RC}.rollout_rs_threshold", to_optional(to_threshold)),
    f"{RC}.bypass_mode": (f"{RC}.bypass_mode", to_bool),
    f"{RC}.loss_type": (f"{RC}.loss_type", to_str),
    "reward_model.reward_manager": ("data.reward_manager", to_reward_manager),
    "reward.reward_manager.name": ("data.reward_manager", to_reward_manager),
    "trainer.nnodes": ("resources.trainer.nnodes", to_int),
    "trainer.n_gpus_per_node": ("resources.trainer.gpus_per_node", to_int),
    "rollout.nnodes": ("resources.rollout.nnodes", to_int),
    "rollout.n_gpus_per_node": ("resources.rollout.gpus_per_node", to_int),
    "rollout.total_rollout_steps": ("rollout.total_rollout_steps", to_int),
    "trainer.total_epochs": ("trainer.total_epochs", to_int),
    "rollout.total_epochs": ("trainer.total_epochs", to_int),
    "trainer.total_training_steps": ("trainer.total_steps", to_optional(to_int)),
    "trainer.test_freq": ("trainer.test_freq", lambda v: max(0, to_int(v))),
    "rollout.test_freq": ("trainer.test_freq", lambda v: max(0, to_int(v))),
    "trainer.val_before_train": ("trainer.val_before_train", to_bool),
    "trainer.save_freq": ("checkpoint.every_versions", to_every),
    "trainer.max_actor_ckpt_to_keep": ("checkpoint.keep_last", to_optional(to_int)),
    "trainer.default_local_dir": ("checkpoint.dir", to_str),
    "trainer.project_name": ("logging.project", to_str),
    "trainer.experiment_name": ("name", to_str),
    "trainer.logger": ("logging.sinks", to_sinks),
    "trainer.seed": ("trainer.seed", to_int),
    "async_training.staleness_threshold": ("async_training.staleness_threshold", to_float),
    "async_training.trigger_parameter_sync_step": ("async_training.trigger_parameter_sync_step", to_int),
    "async_training.require_batches": ("async_training.require_batches", to_int),
    "async_training.partial_rollout": ("async_training.partial_rollout", to_bool),
    f"{ROLL}.multi_turn.enable": ("rollout.multi_turn.enable", to_bool),
    f"{ROLL}.multi_turn.max_assistant_turns": ("rollout.multi_turn.max_assistant_turns", to_optional(to_int)),
    f"{ROLL}.multi_turn.max_user_turns": ("rollout.multi_turn.max_user_turns", to_optional(to_int)),
    f"{ROLL}.multi_turn.max_parallel_calls": ("rollout.multi_turn.max_parallel_calls", to_int),
    f"{ROLL}.multi_turn.format": ("rollout.multi_turn.format", to_tool_format),
    f"{ROLL}.multi_turn.tool_config_path": ("rollout.multi_turn.tool_config_path", to_optional(to_tool_config)),
}
"""verl key → (asyncrl key, converter). A converter's ValueError (a value asyncrl cannot honour) is an error."""
for _cfg in ("reward_model.reward_kwargs.overlong_buffer_cfg", "reward.reward_kwargs.overlong_buffer_cfg",
             "reward_model.overlong_buffer"):
    MAP |= {f"{_cfg}.enable": ("data.overlong_buffer.enable", to_bool),
            f"{_cfg}.len": ("data.overlong_buffer.len", to_int),
            f"{_cfg}.penalty_factor": ("data.overlong_buffer.penalty_factor", to_float),
            f"{_cfg}.log": ("data.overlong_buffer.log", to_bool)}

REQUIRED: dict[str, tuple[tuple[str, ...], str]] = {
    "data.train_batch_size": (("0",), "fully async trains from the stream (verl asserts 0)"),
    "data.gen_batch_size": (("1",), "prompts stream one at a time (verl asserts 1)"),
    f"{ROLL}.mode": (("async",), "asyncrl's rollout is asynchronous"),
    f"{ROLL}.calculate_log_probs": (("true",), "rollout log-probs are always returned"),
    f"{AR}.hybrid_engine": (("false",), "trainer and rollout pools are separate"),
    "algorithm.use_kl_in_reward": (("false",), "asyncrl has the KL loss (trainer.use_kl_loss), not a KL penalty "
                                               "in the reward"),
    f"{ROLL}.val_kwargs.n": (("1",), "asyncrl validates one answer per prompt (@1)"),
    f"{ACTOR}.ulysses_sequence_parallel_size": (("1",), "asyncrl's torch trainer has no Ulysses sequence "
                                                        "parallelism (the megatron backend's trainer.cp splits "
                                                        "sequences)"),
    f"{AR}.ref.ulysses_sequence_parallel_size": (("1",), "asyncrl has no Ulysses sequence parallelism"),
    f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size": (("null", "none", "1"),
                                                               "asyncrl has no virtual pipeline stages"),
    f"{AR}.ref.megatron.virtual_pipeline_model_parallel_size": (("null", "none", "1"),
                                                                "asyncrl has no virtual pipeline stages"),
    f"{ACTOR}.optim.lr_decay_style": (("constant",), "asyncrl's learning rate is constant after warm-up"),
    f"{ACTOR}.megatron.override_transformer_config.moe_router_dtype": (
        ("fp32",), "asyncrl's Megatron router computes in fp32"),
    "trainer.critic_warmup": (("0",), "GRPO has no critic"),
}
"""verl keys asyncrl honours without a key of its own, when the value is the one listed (else: an error)."""

SAME_AS: dict[str, tuple[str, str]] = {
    f"{AR}.ref.log_prob_use_dynamic_bsz": (f"{ACTOR}.use_dynamic_bsz", "one token-budget switch for all passes"),
    f"{ROLL}.log_prob_use_dynamic_bsz": (f"{ACTOR}.use_dynamic_bsz", "one token-budget switch for all passes"),
    **{f"{AR}.ref.megatron.{k}": (f"{ACTOR}.megatron.{k}", "the reference shares the actor's layout")
       for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "expert_tensor_parallel_size")},
    "reward_model.reward_kwargs.max_resp_len": ("data.max_response_length", "the overlong buffer's budget is "
                                                                           "data.max_response_length"),
    "reward.reward_kwargs.max_resp_len": ("data.max_response_length", "the overlong buffer's budget is "
                                                                     "data.max_response_length"),
}
"""verl keys asyncrl honours when they equal another key's value (verl's default when unset), else an error."""

IGNORED: dict[str, str] = {
    "data.return_raw_chat": "asyncrl always renders from the chat messages",
    "trainer.resume_mode": "use `asyncrl launch --resume auto|PATH`",
    "trainer.log_val_generations": "logging only",
    "trainer.device": "the hardware preset decides the device",
    "trainer.use_legacy_worker_impl": "an implementation choice of verl's workers",
    "critic.strategy": "GRPO has no critic",
    "algorithm.kl_ctrl.kl_coef": "no effect without algorithm.use_kl_in_reward",
    "algorithm.filter_groups.max_num_gen_batches": "a cap past which verl stops with an error; asyncrl samples "
                                                   "until the prompts run out, then ends the run",
    f"{AR}.nccl_timeout": "a timeout",
    f"{AR}.model.use_remove_padding": "padding removal is a speed-up with the same result",
    f"{AR}.model.use_fused_kernels": "fused kernels: speed only",
    f"{AR}.model.enable_activation_offload": "memory placement only",
    f"{AR}.model.use_shm": "loading only",
    f"{AR}.model.override_config.max_position_embeddings": (
        "asyncrl uses the model's config.json; raise max_position_embeddings there: validate warns when "
        "max_prompt_length + max_response_length exceeds it, and the rollout refuses, so the run fails loudly "
        "instead of differently"),
    f"{AR}.model.override_config.model_config.max_position_embeddings": (
        "asyncrl uses the model's config.json; raise max_position_embeddings there (validate warns, the run "
        "fails loudly instead of differently)"),
    f"{ACTOR}.use_rollout_log_probs": "bypass_mode decides which log-probs act as π_old",
    "async_training.use_rollout_log_probs": "removed in verl; bypass_mode decides",
    f"{ACTOR}.entropy_from_logits_with_chunking": "memory only (asyncrl's log-prob head is chunked)",
    f"{ACTOR}.optim.lr_decay_steps": "no effect with a constant learning rate",
    f"{ROLL}.log_prob_micro_batch_size_per_gpu": "log-prob micro-batching: speed and memory only",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": "log-prob micro-batching: speed and memory only",
    f"{ROLL}.free_cache_engine": "vLLM memory management: speed only",
    f"{ROLL}.enforce_eager": "vLLM CUDA graphs: speed only",
    f"{ROLL}.enable_chunked_prefill": "vLLM scheduling: speed only",
    f"{ROLL}.enable_prefix_caching": "vLLM prefix cache: speed only",
    f"{ROLL}.enable_sleep_mode": "vLLM memory management: speed only",
    f"{ROLL}.max_num_batched_tokens": "vLLM scheduling: speed only",
    f"{ROLL}.max_model_len": "vLLM's context window: asyncrl sizes it to max_prompt_length + max_response_length",
    f"{ROLL}.checkpoint_engine.backend": "the weight transport to the replicas: speed only",
    f"{ROLL}.val_kwargs.do_sample": "read with val_kwargs.temperature (false = greedy = val_temperature 0)",
    f"{ROLL}.multi_turn.use_inference_chat_template": "asyncrl never re-renders a conversation: the trained tokens "
                                                      "are the sampled ones (token in, token out)",
    f"{ROLL}.agent.num_workers": "agent-loop worker processes: speed only",
    f"{ROLL}.multi_turn.tokenization_sanity_check_mode": "a check of re-tokenisation, which asyncrl never does",
}
"""verl keys with no effect on the experiment (speed, memory placement, logging, paths), with the reason."""

IGNORED_PREFIXES: dict[str, str] = {
    f"{ROLL}.engine_kwargs.": "vLLM engine tuning (compilation, caches): speed only",
    f"{ACTOR}.fsdp_config.": "FSDP sharding, prefetch and offload: speed and memory only (validate checks memory)",
    f"{AR}.ref.fsdp_config.": "FSDP sharding, prefetch and offload: speed and memory only",
    f"{ACTOR}.megatron.use_": "Megatron checkpoint format / weight bridge: loading only",
    f"{AR}.ref.megatron.use_": "Megatron checkpoint format / weight bridge: loading only",
    f"{ACTOR}.megatron.param_offload": "offload: memory placement only (validate checks memory)",
    f"{ACTOR}.megatron.grad_offload": "offload: memory placement only (validate checks memory)",
    f"{ACTOR}.megatron.optimizer_offload": "offload: memory placement only (validate checks memory)",
    f"{ACTOR}.optim.override_optimizer_config.": "Megatron optimizer CPU offload / precision-aware kernel with its "
                                                 "default fp32 states: memory and speed only",
    **{f"{ACTOR}.megatron.override_transformer_config.{k}": "kernel fusion / MoE dispatch implementation: speed only"
       for k in ("apply_rope_fusion", "masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion",
                 "gradient_accumulation_fusion", "deallocate_pipeline_outputs", "persist_layer_norm",
                 "moe_grouped_gemm", "moe_permute_fusion", "moe_token_dispatcher_type", "moe_enable_deepep")},
}
"""Key prefixes with no effect on the experiment."""

REFUSED_PREFIXES: dict[str, str] = {
    f"{ROLL}.multi_turn.interaction_config_path": "interactions (a simulated user answering the model's turns) "
                                                  "are not in asyncrl: its user turns are tool answers only",
    f"{ROLL}.multi_turn.max_tool_response_length": "asyncrl does not cut a tool's answer to a length of its own "
                                                   "(only to the response budget)",
    f"{ROLL}.multi_turn.tool_response_truncate_side": "asyncrl does not cut a tool's answer to a length of its own",
    f"{ROLL}.multi_turn.completion_callback": "a custom completion callback is not in asyncrl",
    f"{ROLL}.agent.agent_loop_config_path": "a custom agent loop is not in asyncrl: its one agent loop parses "
                                            "the model's tool calls (rollout.multi_turn)",
    f"{ROLL}.agent.custom_async_server.": "a custom rollout server is not in asyncrl",
    "data.custom_cls.": "a custom dataset class is not supported (asyncrl reads verl's parquet row layout)",
    f"{ROLL}.data_parallel_size": "rollout data parallelism inside a replica: asyncrl's replicas are tensor "
                                  "parallel only",
    f"{ROLL}.expert_parallel_size": "rollout expert parallelism: asyncrl's replicas are tensor parallel only",
    f"{ACTOR}.megatron.override_transformer_config.num_layers_in_": "uneven pipeline stages: asyncrl splits the "
                                                                     "layers evenly",
    "async_training.hybrid_res_pool": "a hybrid resource pool (trainer and rollout sharing devices) is not in asyncrl",
    f"{AR}.partition": "a hybrid resource pool's partition of the devices is not in asyncrl",
    f"{AR}.model.mtp.": "multi-token prediction is not in asyncrl",
    f"{AR}.model.lora_rank": "LoRA is not in asyncrl",
    "reward_model.enable": "a reward model is not in asyncrl (rule-based rewards and functions only)",
}
"""Key prefixes that change the experiment in a way asyncrl cannot honour: the conversion stops (exit 1)."""

REMOVED: dict[str, str] = {
    f"{RC}.rollout_token_veto_threshold": "removed in verl (#4544): there is no veto any more",
    f"{RC}.rollout_rs_threshold_lower": 'removed in verl: k1 thresholds are one "lower_upper" spec',
    f"{RC}.bypass_old_logprob_for_rollout": "removed in verl: use bypass_mode",
    f"{RC}.use_pure_rollout_correction": "removed in verl: use bypass_mode + loss_type",
}
"""Keys verl removed: an error (the script is older than the verl asyncrl follows), with the reason."""

BASE_CONFIGS: dict[str, str] = {
    "fully_async_ppo_trainer": "torch",
    "fully_async_ppo_megatron_trainer": "megatron",
}
"""`--config-name` base configs whose defaults the importer knows (→ the trainer backend they imply)."""

VERL_DEFAULTS: dict[str, tuple[Any, str]] = {
    "rollout.backend": ("vllm", "verl's default rollout engine"),
    "model.dtype": ("bfloat16", "verl trains and serves in bf16"),
    "data.filter_overlong_prompts": (False, "verl's default (an over-long prompt is an error, as truncation='error')"),
    "rollout.n": (4, "verl's fully-async default rollout.n"),
    "rollout.tensor_parallel_size": (2, "verl's default rollout tensor_model_parallel_size"),
    "rollout.gpu_memory_utilization": (0.5, "verl's default gpu_memory_utilization"),
    "rollout.max_num_seqs": (1024, "verl's default max_num_seqs"),
    "trainer.ppo_mini_batch_size": (256, "verl's default ppo_mini_batch_size"),
    "trainer.total_epochs": (10, "verl's fully-async default rollout.total_epochs"),
    "trainer.val_before_train": (True, "verl's default val_before_train"),
    "trainer.test_freq": (1, "verl's fully-async default rollout.test_freq"),
}
"""Values verl uses when the script says nothing, where asyncrl's own default differs."""

RESOURCE_VARS: dict[str, tuple[str, ...]] = {
    "n_gpus_rollout": ("resources.rollout.gpus_per_node",),
    "n_gpus_training": ("resources.trainer.gpus_per_node",),
    "n_nodes_rollout": ("resources.rollout.nnodes",),
    "n_nodes_train": ("resources.trainer.nnodes",),
    "NNODES_ROLLOUT": ("resources.rollout.nnodes",),
    "NNODES_TRAIN": ("resources.trainer.nnodes",),
    "NGPUS_PER_NODE": ("resources.rollout.gpus_per_node", "resources.trainer.gpus_per_node"),
}
"""Shell variables that carry the resources when the overrides do not."""


@dataclass
class Conversion:
    """The result: asyncrl values by dotted key, the verl source of each, and every other override accounted
    for: ignored (no effect on the experiment, with the reason) or an error (the conversion stops)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    script: Script | None = None
    found_launch: bool = True
    """False when the script has no verl launch command and no `*_CONFIG` override block: nothing to convert."""


def _is_launch(cmd: list[str]) -> bool:
    """A `python -m verl…main` command line."""
    return any(w.endswith("fully_async_main") or "main_ppo" in w or (w.startswith("verl.") and "main" in w)
               for w in cmd)


def overrides_of(script: Script) -> tuple[list[str], list[str]]:
    """(Hydra overrides, --config-name values) of the verl launch command (or of the *_CONFIG blocks)."""
    for cmd in script.commands:
        if _is_launch(cmd):
            names = [w.split("=", 1)[1] for w in cmd if w.startswith("--config-name=")]
            return [w for w in cmd if "=" in w and not w.startswith("-")], names
    blocks = [v for k, v in script.variables.items() if k.endswith("_CONFIG")]
    return [w for b in blocks for w in b.split() if "=" in w], []


def _legacy_band(lower: str, upper: str) -> str | None:
    """The k1 spec of a legacy `_threshold_lower` / `_threshold` pair: the legacy modes bounded π_train/π_rollout,
    the k1 options bound π_rollout/π_train, so [lo, hi] becomes [1/hi, 1/lo] (`invert_band`)."""
    try:
        lo, hi = to_threshold(lower), to_threshold(upper)
    except ValueError:
        return None
    if not isinstance(lo, float) or not isinstance(hi, float) or not 0 < lo < hi:
        return None
    new_lo, new_hi = invert_band(lo, hi)
    return f"{new_lo:.12g}_{new_hi:.12g}"


def _legacy_rs(conv: Conversion, raw: dict[str, str]) -> None:
    """verl's pre-#4544 `rollout_rs=token|sequence|geometric` + `_threshold` + `_threshold_lower` → the canonical
    k1 option with the band inverted (see `_legacy_band`)."""
    rs = raw.get(f"{RC}.rollout_rs")
    if rs is None:
        return
    val = _unquote(rs)
    if val in ("null", "None"):
        conv.sources[f"{RC}.rollout_rs"] = f"{RC}.rollout_rs={rs}"
        return
    if val in LEGACY_RS:
        new = LEGACY_RS[val]
        conv.values[f"{RC}.rollout_rs"] = new
        lower = raw.pop(f"{RC}.rollout_rs_threshold_lower", None)
        upper = raw.get(f"{RC}.rollout_rs_threshold")
        spec = _legacy_band(lower, upper) if upper is not None and lower is not None else None
        if spec is not None:
            conv.values[f"{RC}.rollout_rs_threshold"] = spec
            raw.pop(f"{RC}.rollout_rs_threshold")
            conv.sources[f"{RC}.rollout_rs_threshold"] = "legacy rollout_rs_threshold(_lower), inverted"
            conv.notes.append(f"legacy rollout_rs={val!r} converted to {new!r} with the band inverted to {spec} "
                              f"(the legacy mode bounded π_train/π_rollout, {new} bounds π_rollout/π_train)")
        else:
            conv.notes.append(f"legacy rollout_rs={val!r} converted to {new!r} (verl removed the old values)")
    else:
        conv.values[f"{RC}.rollout_rs"] = val
    conv.sources[f"{RC}.rollout_rs"] = f"{RC}.rollout_rs={rs}"


def _classify(conv: Conversion, key: str, value: str, raw: dict[str, str]) -> None:
    """Put one override in exactly one list (see the module docstring)."""
    ov = f"{key}={value}"
    refused = next((why for pre, why in REFUSED_PREFIXES.items() if key.startswith(pre)), None)
    if refused is not None:
        conv.errors.append((ov, refused))
    elif key in MAP:
        target, fn = MAP[key]
        try:
            converted = fn(value)
        except ValueError as e:
            conv.errors.append((ov, str(e)))
            return
        if converted is None:
            conv.ignored.append((ov, "null: verl's default, which asyncrl's equals"))
            return
        if target in conv.values and conv.sources.get(target, "").partition("=")[0] in MAP:
            if conv.values[target] != converted:
                conv.errors.append((ov, f"conflicts with {conv.sources[target]}: asyncrl has one {target}"))
            else:
                conv.ignored.append((ov, f"the same {target} as {conv.sources[target]}"))
            return
        conv.values[target] = converted
        conv.sources[target] = ov
    elif key in REQUIRED:
        accepted, why = REQUIRED[key]
        if concrete(_unquote(value)).lower() in accepted:
            conv.ignored.append((ov, why))
        else:
            conv.errors.append((ov, f"only {' / '.join(accepted)}: {why}"))
    elif key in SAME_AS:
        other, why = SAME_AS[key]
        if _same(value, raw.get(other)):
            conv.ignored.append((ov, f"equals {other}: {why}"))
        else:
            conv.errors.append((ov, f"differs from {other}={raw.get(other)}: {why}"))
    elif key in IGNORED:
        conv.ignored.append((ov, IGNORED[key]))
    elif any(key.startswith(pre) for pre in IGNORED_PREFIXES):
        conv.ignored.append((ov, next(why for pre, why in IGNORED_PREFIXES.items() if key.startswith(pre))))
    elif key in REMOVED:
        conv.errors.append((ov, REMOVED[key]))
    else:
        conv.errors.append((ov, "not known to asyncrl's importer: it may change the experiment"))


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b or (a is not None and _unquote(a) in ("null", "None"))
    x, y = concrete(_unquote(a)).lower(), concrete(_unquote(b)).lower()
    try:
        return float(x) == float(y)
    except ValueError:
        return x == y


def _special(conv: Conversion, raw: dict[str, str]) -> None:
    """Keys whose meaning depends on others: truncation, the custom reward function, validation sampling."""
    trunc = raw.pop("data.truncation", None)
    if trunc is not None:
        ov, mode = f"data.truncation={trunc}", concrete(_unquote(trunc))
        if to_bool_safe(raw.get("data.filter_overlong_prompts", "false")):
            conv.ignored.append((ov, "over-long prompts are filtered before truncation applies"))
        elif mode == "error":
            conv.ignored.append((ov, "asyncrl raises on an over-long prompt too (filter_overlong_prompts = false)"))
        elif mode in ("left", "right", "middle"):
            conv.ignored.append((ov, "asyncrl does not truncate: an over-long prompt stops the run (DataError) "
                                     "instead of being cut, so the run is verl's or fails loudly"))
        else:
            conv.errors.append((ov, f"unknown truncation {mode!r}"))
    for prefix in ("reward.custom_reward_function", "custom_reward_function"):
        path, name = raw.pop(f"{prefix}.path", None), raw.pop(f"{prefix}.name", None)
        if path is None and name is None:
            continue
        if path is None or _unquote(path) in ("null", "None", ""):
            conv.ignored.append((f"{prefix}.name={name}", "no custom reward path: the default reward"))
            continue
        fn = to_str(name) if name is not None else "compute_score"
        conv.values["data.reward"] = f"{to_str(path)}:{fn}"
        conv.sources["data.reward"] = f"{prefix}.path={path} {prefix}.name={name}"
    standalone = raw.pop(f"{ROLL}.standalone_gpu_memory_utilization", None)
    if standalone is not None and _unquote(standalone) not in ("null", "None"):
        try:
            conv.values["rollout.gpu_memory_utilization"] = to_float(standalone)
            conv.sources["rollout.gpu_memory_utilization"] = f"{ROLL}.standalone_gpu_memory_utilization={standalone}"
        except ValueError as e:
            conv.errors.append((f"{ROLL}.standalone_gpu_memory_utilization={standalone}", str(e)))
        shared = raw.pop(f"{ROLL}.gpu_memory_utilization", None)
        if shared is not None:
            conv.ignored.append((f"{ROLL}.gpu_memory_utilization={shared}", "for replicas sharing devices with the "
                                 "trainer; asyncrl's replicas are standalone"))
    elif standalone is not None:
        conv.ignored.append((f"{ROLL}.standalone_gpu_memory_utilization={standalone}",
                             "null: gpu_memory_utilization applies"))
    sample = raw.pop(f"{ROLL}.val_kwargs.do_sample", None)
    if sample is not None and not to_bool_safe(sample):
        conv.values["rollout.val_temperature"] = 0.0
        conv.sources["rollout.val_temperature"] = f"{ROLL}.val_kwargs.do_sample={sample} (greedy)"
        raw.pop(f"{ROLL}.val_kwargs.temperature", None)
    elif sample is not None:
        conv.ignored.append((f"{ROLL}.val_kwargs.do_sample={sample}", IGNORED[f"{ROLL}.val_kwargs.do_sample"]))
    elif f"{ROLL}.val_kwargs.temperature" in raw:  # verl samples greedily unless do_sample (default false)
        t = raw.pop(f"{ROLL}.val_kwargs.temperature")
        conv.ignored.append((f"{ROLL}.val_kwargs.temperature={t}", "verl validates greedily without "
                                                                   "val_kwargs.do_sample=True (val_temperature 0)"))


def convert_script(text: str) -> Conversion:
    """Read a verl fully-async script and account for every override."""
    script = parse_script(text)
    conv = Conversion(script=script)
    conv.notes += script.notes
    conv.errors += [(u, "the shell reader cannot resolve it") for u in script.unparsed]
    overrides, config_names = overrides_of(script)
    conv.found_launch = bool(overrides or config_names) or any(_is_launch(cmd) for cmd in script.commands)
    for cfg_name in config_names:
        stem = _unquote(cfg_name).removesuffix(".yaml")
        if stem in BASE_CONFIGS:
            conv.values["trainer.backend"] = BASE_CONFIGS[stem]
            conv.sources["trainer.backend"] = f"--config-name={cfg_name}"
        else:
            conv.errors.append((f"--config-name={cfg_name}", "a base config whose defaults the importer does not "
                                f"know (it knows {', '.join(BASE_CONFIGS)})"))
    raw: dict[str, str] = {}
    for ov in overrides:
        key, _, value = ov.partition("=")
        key = key.lstrip("+~")
        if key in raw and not _same(raw[key], value):
            conv.errors.append((ov, f"set twice with different values ({raw[key]})"))
        raw[key] = value
    unresolved = {key for key, value in raw.items() if "$(" in value}
    for key in unresolved:  # one error each; the value is not converted as well
        why = ("arithmetic the shell reader cannot evaluate" if "$((" in raw[key]
               else "a command substitution the shell reader does not run")
        conv.errors.append((f"{key}={raw[key]}", why))
    _legacy_rs(conv, raw)
    raw.pop(f"{RC}.rollout_rs", None)
    if to_bool_safe(raw.pop("async_training.compute_prox_log_prob", "false")):
        conv.values[f"{RC}.bypass_mode"] = False
        conv.sources[f"{RC}.bypass_mode"] = "async_training.compute_prox_log_prob=True"
        conv.notes.append("compute_prox_log_prob=True (removed in verl) → bypass_mode = false (decoupled)")
    _special(conv, raw)
    for key, value in raw.items():
        if key not in unresolved:
            _classify(conv, key, value, raw)
    if "algorithm.adv_estimator" not in raw:
        conv.errors.append(("algorithm.adv_estimator (unset)", "verl's default is gae (PPO with a critic); "
                            "asyncrl runs grpo: set it in the script"))
    for var, targets in RESOURCE_VARS.items():
        if var not in script.variables:
            continue
        for target in targets:
            if target not in conv.values:
                try:
                    conv.values[target] = to_int(script.variables[var])
                    conv.sources[target] = f"shell variable {var}={script.variables[var]}"
                except ValueError:
                    pass
    for target, (value, why) in VERL_DEFAULTS.items():
        if target not in conv.values:
            conv.values[target] = value
            conv.sources[target] = why
    if conv.values.get("trainer.backend", "torch") == "torch" and "trainer.enable_gradient_checkpointing" not in conv.values:
        conv.values["trainer.enable_gradient_checkpointing"] = True
        conv.sources["trainer.enable_gradient_checkpointing"] = "verl's default model.enable_gradient_checkpointing"
    model = str(conv.values.get("model.path", "")).lower()
    if "data.image_key" not in conv.values and "vl" in re.split(r"[^a-z0-9]+", model.replace("-vl", " vl ")):
        conv.values["data.image_key"] = "images"
        conv.sources["data.image_key"] = "verl's default image_key (a vision-language model)"
    return conv


def to_bool_safe(v: str) -> bool:
    """A boolean, or False when the value is not one."""
    try:
        return to_bool(v)
    except ValueError:
        return False
