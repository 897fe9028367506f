"""The key contract of the verl importer (`asyncrl_cli.verl_import.convert`'s docstring says how each table is
used): verl key → asyncrl key and converter (`MAP`), values asyncrl requires or derives (`REQUIRED`,
`SAME_AS`), keys without effect on the experiment (`IGNORED`, `IGNORED_PREFIXES`), keys it refuses
(`REFUSED_PREFIXES`, `REMOVED`), the base configs it knows, verl's defaults and the resource variables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl_cli.verl_import.values import (
    ACTOR,
    AR,
    RC,
    ROLL,
    to_attn_implementation,
    to_backend,
    to_bool,
    to_every,
    to_float,
    to_int,
    to_list,
    to_load_balancing,
    to_loss_mode,
    to_optional,
    to_reward_manager,
    to_rollout_backend,
    to_sinks,
    to_str,
    to_threshold,
    to_tool_config,
    to_tool_format,
    to_top_k,
)

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
    f"{AR}.model.use_remove_padding": ("trainer.use_remove_padding", to_bool),
    f"{ACTOR}.strategy": ("trainer.backend", to_backend),
    f"{ACTOR}.fsdp_config.strategy": ("trainer.backend", to_backend),
    f"{ACTOR}.megatron.tensor_model_parallel_size": ("trainer.tp", to_int),
    f"{ACTOR}.megatron.pipeline_model_parallel_size": ("trainer.pp", to_int),
    f"{ACTOR}.megatron.context_parallel_size": ("trainer.cp", to_int),
    f"{ACTOR}.megatron.override_transformer_config.context_parallel_size": ("trainer.cp", to_int),
    f"{ACTOR}.ulysses_sequence_parallel_size": ("trainer.ulysses_sequence_parallel_size", to_int),
    f"{ACTOR}.megatron.expert_model_parallel_size": ("trainer.ep", to_int),
    f"{ACTOR}.megatron.expert_tensor_parallel_size": ("trainer.etp", to_int),
    f"{ACTOR}.megatron.override_transformer_config.recompute_granularity": ("trainer.recompute_granularity", to_str),
    f"{ACTOR}.megatron.override_transformer_config.recompute_method": ("trainer.recompute_method", to_str),
    f"{ACTOR}.megatron.override_transformer_config.recompute_num_layers": ("trainer.recompute_num_layers", to_int),
    **{f"{ACTOR}.megatron.override_transformer_config.{k}": (f"trainer.{k}", to_int)
       for k in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")},
    f"{ACTOR}.megatron.override_transformer_config.moe_aux_loss_coeff": ("trainer.moe_aux_loss_coeff", to_float),
    f"{ACTOR}.megatron.override_transformer_config.moe_z_loss_coeff": ("trainer.moe_z_loss_coeff",
                                                                        to_optional(to_float)),
    f"{ACTOR}.megatron.override_transformer_config.moe_router_load_balancing_type": (
        "trainer.moe_router_load_balancing_type", to_load_balancing),
    f"{ACTOR}.megatron.override_transformer_config.use_flash_attn": ("trainer.use_flash_attn", to_bool),
    f"{ACTOR}.megatron.override_transformer_config.attention_dropout": ("trainer.attention_dropout", to_float),
    f"{ACTOR}.megatron.override_transformer_config.hidden_dropout": ("trainer.hidden_dropout", to_float),
    f"{AR}.model.override_config.attention_dropout": ("trainer.attention_dropout", to_float),
    f"{AR}.ref.megatron.param_offload": ("trainer.ref_param_offload", to_bool),
    f"{AR}.ref.fsdp_config.param_offload": ("trainer.ref_param_offload", to_bool),
    f"{ACTOR}.optim.lr": ("trainer.optim.lr", to_float),
    f"{ACTOR}.optim.lr_warmup_steps": ("trainer.optim.warmup_steps", lambda v: max(0, to_int(v))),
    f"{ACTOR}.optim.weight_decay": ("trainer.optim.weight_decay", to_float),
    f"{ACTOR}.optim.betas": ("trainer.optim.betas", lambda v: [to_float(x) for x in to_list(v)]),
    f"{ACTOR}.grad_clip": ("trainer.grad_clip", to_float),
    f"{ACTOR}.optim.clip_grad": ("trainer.grad_clip", to_float),
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
    f"{ACTOR}.policy_loss.loss_mode": ("trainer.loss_mode", to_loss_mode),
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
    f"{ROLL}.pipeline_model_parallel_size": ("rollout.pipeline_model_parallel_size", to_int),
    f"{ROLL}.data_parallel_size": ("rollout.data_parallel_size", to_int),
    f"{ROLL}.expert_parallel_size": ("rollout.expert_parallel_size", to_int),
    f"{ROLL}.quantization": ("rollout.quantization", to_str),
    f"{ROLL}.gpu_memory_utilization": ("rollout.gpu_memory_utilization", to_float),
    f"{ROLL}.max_num_seqs": ("rollout.max_num_seqs", to_int),
    f"{ROLL}.update_weights_bucket_megabytes": ("rollout.weight_sync_bucket_mb", to_int),
    f"{ROLL}.checkpoint_engine.update_weights_bucket_megabytes": ("rollout.weight_sync_bucket_mb", to_int),
    f"{ROLL}.val_kwargs.temperature": ("rollout.val_temperature", to_float),
    f"{ROLL}.val_kwargs.top_p": ("rollout.val_top_p", to_float),
    f"{ROLL}.val_kwargs.top_k": ("rollout.val_top_k", to_top_k),
    f"{ROLL}.val_kwargs.n": ("rollout.val_n", to_int),
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
    "algorithm.use_kl_in_reward": (("false",), "true would subtract algorithm.kl_ctrl.kl_coef × KL(π_old‖π_ref) "
                                               "from each token's reward before the advantages; asyncrl has the "
                                               "KL loss (trainer.use_kl_loss) only"),
    f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size": (("null", "none", "1"),
                                                               "asyncrl has no virtual pipeline stages"),
    f"{AR}.ref.megatron.virtual_pipeline_model_parallel_size": (("null", "none", "1"),
                                                                "asyncrl has no virtual pipeline stages"),
    **{f"{AR}.model.override_config.{k}": (("0", "0.", "0.0"), "dropout 0 is a no-op where the model's config "
                                                                "already says 0 (as Qwen's and Llama's do; asyncrl "
                                                                "trains with the config's dropout); another value "
                                                                "is not honoured")
       for k in ("embd_pdrop", "resid_pdrop", "hidden_dropout", "dropout")},
    f"{ACTOR}.megatron.vanilla_mbridge": (("false", "null", "none"), "verl's legacy mbridge builds a MoE router with "
                                          "its own load-balancing loss (mbridge's qwen3_moe: aux_loss at the "
                                          "model's router_aux_loss_coef); asyncrl follows verl's default "
                                          "Megatron-Bridge path (load-balancing \"none\", "
                                          "trainer.moe_router_load_balancing_type)"),
    f"{ACTOR}.optim.lr_decay_style": (("constant",), "asyncrl's learning rate is constant after warm-up"),
    f"{ACTOR}.megatron.override_transformer_config.moe_router_dtype": (
        ("fp32",), "asyncrl's Megatron router computes in fp32"),
    "trainer.critic_warmup": (("0",), "GRPO has no critic"),
    **{f"{_role}.megatron.override_transformer_config.fp8": (
        ("false", "null", "none"), "FP8 training is not in asyncrl (bf16 compute, fp32 master weights)")
       for _role in (ACTOR, f"{AR}.ref")},
}
"""verl keys asyncrl honours without a key of its own, when the value is the one listed (else: an error)."""

SAME_AS: dict[str, tuple[str, str]] = {
    f"{AR}.ref.log_prob_use_dynamic_bsz": (f"{ACTOR}.use_dynamic_bsz", "one token-budget switch for all passes"),
    f"{ROLL}.log_prob_use_dynamic_bsz": (f"{ACTOR}.use_dynamic_bsz", "one token-budget switch for all passes"),
    "reward_model.reward_kwargs.max_resp_len": ("data.max_response_length", "the overlong buffer's budget is "
                                                                           "data.max_response_length"),
    "reward.reward_kwargs.max_resp_len": ("data.max_response_length", "the overlong buffer's budget is "
                                                                     "data.max_response_length"),
    f"{ROLL}.prompt_length": ("data.max_prompt_length", "verl's default (${data.max_prompt_length}); asyncrl "
                                                        "has one prompt budget"),
    f"{ROLL}.response_length": ("data.max_response_length", "verl's default (${data.max_response_length}); "
                                                            "asyncrl has one response budget"),
}
"""verl keys asyncrl honours when they equal another key's value (verl's default when unset), else an error."""

LAYOUT_ONLY: dict[str, tuple[str, str]] = {
    f"{AR}.ref.megatron.{k}": (f"{ACTOR}.megatron.{k}", "the reference's own Megatron layout: a layout splits the "
                                                        "same computation (the reference's log-probs are the "
                                                        "same, up to summation order), so asyncrl builds the "
                                                        "reference on the actor's layout and validate counts its "
                                                        "memory there: speed and memory only")
    for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
              "expert_model_parallel_size", "expert_tensor_parallel_size")
} | {
    f"{AR}.ref.ulysses_sequence_parallel_size": (f"{ACTOR}.ulysses_sequence_parallel_size", "the reference's own "
                                                 "Ulysses size: Ulysses splits the same attention over the SP "
                                                 "group (the reference's log-probs are the same, up to summation "
                                                 "order), so asyncrl runs the reference at the actor's size and "
                                                 "validate counts its memory there: speed and memory only")
}
"""verl keys that only choose how a computation is split: equal to another key's value, or not, they are ignored
(with the reason when they differ)."""

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
    f"{ROLL}.val_kwargs.do_sample": "verl's fully-async agent loop samples validation at val_kwargs.temperature "
                                    "whatever do_sample says (fully_async_policy/agent_loop/agent_loop.py); "
                                    "temperature 0 = greedy",
    f"{ROLL}.multi_turn.use_inference_chat_template": "asyncrl never re-renders a conversation: the trained tokens "
                                                      "are the sampled ones (token in, token out)",
    f"{ROLL}.agent.num_workers": "agent-loop worker processes: speed only",
    f"{ROLL}.multi_turn.tokenization_sanity_check_mode": "a check of re-tokenisation, which asyncrl never does",
    f"{ROLL}.disable_log_stats": "vLLM's statistics log: logging only",
    f"{ACTOR}.use_torch_compile": "torch.compile of verl's log-prob path: speed only",
    f"{AR}.ref.use_torch_compile": "torch.compile of verl's log-prob path: speed only",
    "data.val_batch_size": "deprecated in verl: the validation set goes to the rollout as one batch (speed only)",
    "data.trust_remote_code": "asyncrl runs no dataset code; the tokenizer loads with model.trust_remote_code",
    "trainer.balance_batch": "verl's reordering of sequences over data-parallel ranks to even their tokens: "
                             "speed only (asyncrl's token-budget micro-batches balance tokens per rank)",
    "trainer.worker_env.PYTORCH_CUDA_ALLOC_CONF": "the CUDA allocator's settings: memory placement only",
    f"{ACTOR}.checkpoint.async_save": "checkpoint writing in the background: speed only",
    f"{ACTOR}.checkpoint.save_contents": "what verl's checkpoint holds; asyncrl's holds what a bit-identical "
                                         "resume needs, and exports HF weights",
    f"{ACTOR}.megatron.vanilla_mbridge": "Megatron weight bridge: loading only",
}
"""verl keys with no effect on the experiment (speed, memory placement, logging, paths), with the reason."""

IGNORED_PREFIXES: dict[str, str] = {
    f"{ROLL}.engine_kwargs.vllm.": "vLLM engine tuning (compilation, caches): speed only",
    f"{ACTOR}.fsdp_config.": "FSDP sharding, prefetch and offload: speed and memory only (validate checks memory)",
    f"{AR}.ref.fsdp_config.": "FSDP sharding, prefetch and offload: speed and memory only",
    f"{ACTOR}.megatron.use_": "Megatron checkpoint format / weight bridge: loading only",
    f"{AR}.ref.megatron.use_": "Megatron checkpoint format / weight bridge: loading only",
    f"{ACTOR}.megatron.param_offload": "offload: memory placement only (validate checks memory)",
    f"{ACTOR}.megatron.grad_offload": "offload: memory placement only (validate checks memory)",
    f"{ACTOR}.megatron.optimizer_offload": "offload: memory placement only (validate checks memory)",
    f"{ACTOR}.optim.override_optimizer_config.": "Megatron optimizer CPU offload / precision-aware kernel with its "
                                                 "default fp32 states: memory and speed only",
    **{f"{_role}.megatron.override_transformer_config.{k}": "kernel fusion / MoE dispatch implementation / "
                                                            "attention kernel choice: speed only"
       for _role in (ACTOR, f"{AR}.ref")
       for k in ("apply_rope_fusion", "masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion",
                 "gradient_accumulation_fusion", "deallocate_pipeline_outputs", "persist_layer_norm",
                 "moe_grouped_gemm", "moe_permute_fusion", "moe_token_dispatcher_type", "moe_enable_deepep",
                 "moe_shared_expert_overlap", "attention_backend")},
    f"{ROLL}.prometheus.": "vLLM's metrics exporter: monitoring only",
    "ray_kwargs.": "how verl starts its Ray workers (runtime environment, interpreter): not the experiment",
}
"""Key prefixes with no effect on the experiment."""

TOOL_CUT = ("verl cuts every tool's answer to max_tool_response_length characters (default 256) on "
            "tool_response_truncate_side (default middle: head and tail kept, \"...(truncated)...\" between); asyncrl "
            "keeps the head of each answer up to the tool's own max_output_chars (4096 for built-in and verl tool "
            "classes, set per [[rollout.multi_turn.tool]]): a longer answer reads differently")

REFUSED_PREFIXES: dict[str, str] = {
    f"{ROLL}.multi_turn.interaction_config_path": "interactions (a simulated user answering the model's turns) "
                                                  "are not in asyncrl: its user turns are tool answers only",
    f"{ROLL}.multi_turn.max_tool_response_length": TOOL_CUT,
    f"{ROLL}.multi_turn.tool_response_truncate_side": TOOL_CUT,
    f"{ROLL}.single_turn_response_length": "not a key of verl 1dda039: no verl code reads it and verl's Hydra "
                                           "config refuses to override a key it lacks (verl stops at launch); a "
                                           "cap on each model turn is rollout.multi_turn.max_tokens_per_turn",
    f"{ROLL}.multi_turn.completion_callback": "a custom completion callback is not in asyncrl",
    f"{ROLL}.agent.agent_loop_config_path": "a custom agent loop is not in asyncrl: its one agent loop parses "
                                            "the model's tool calls (rollout.multi_turn)",
    f"{ROLL}.agent.custom_async_server.": "a custom rollout server is not in asyncrl",
    "data.custom_cls.": "verl's custom dataset class cannot be loaded without verl: write its row transform as a "
                        "plain Python function def fn(row: dict) -> dict (a raw row in, verl's row layout out: "
                        "prompt, data_source, reward_model.ground_truth, extra_info) and pass it with "
                        "--row-adapter file.py:fn (it becomes data.row_adapter = \"file.py:fn\")",
    "async_training.use_dynamic_resource_scheduling": "dynamic resource scaling (moving devices between the "
                                                      "pools during a run) is not in asyncrl",
    "async_training.dynamic_schedule_": "dynamic resource scaling is not in asyncrl",
    "async_training.hybrid_res_pool": "a hybrid resource pool (trainer and rollout sharing devices) is not in asyncrl",
    f"{AR}.partition": "a hybrid resource pool's partition of the devices is not in asyncrl",
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
    "fully_async_dapo_trainer": "torch",
}
"""`--config-name` base configs whose defaults the importer knows (→ the trainer backend they imply)."""

BASE_CONFIG_FACTS: dict[str, str] = {
    "fully_async_dapo_trainer": (
        "--config-name=fully_async_dapo_trainer: verl ships no such file (verl/experimental/fully_async_policy/"
        "config/ holds fully_async_ppo_trainer.yaml and fully_async_ppo_megatron_trainer.yaml, verl-project/verl "
        "1dda039); every DAPO setting of the script is an override, so its base is fully_async_ppo_trainer's "
        "defaults (verl itself stops at the missing file)"),
}
"""What the importer knows of a base config beyond its backend: written into the file as a note."""

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
