# asyncrl conformance corpus: the overrides of verl's
#   verl/experimental/fully_async_policy/shell/grpo_qwen3_235b_megatron_npu.sh @ verl-project/verl 887eb2b0cb5d2b23219ecfdf04f5e2f173160374
# written out as key=value facts; not a copy of the script.
NNODES_ROLLOUT=${NNODES_ROLLOUT:-8}
NNODES_TRAIN=${NNODES_TRAIN:-8}
NGPUS_PER_NODE=${NGPUS_PER_NODE:-16}
python -m verl.experimental.fully_async_policy.fully_async_main --config-path=config \
  --config-name='fully_async_ppo_megatron_trainer.yaml' \
  algorithm.adv_estimator=grpo data.train_files="gsm8k/train.parquet" data.val_files="gsm8k/test.parquet" \
  actor_rollout_ref.rollout.free_cache_engine=True data.train_batch_size=0 data.max_prompt_length=$((1024 * 8)) \
  data.max_response_length=$((1024 * 4)) data.filter_overlong_prompts=False data.truncation='error' \
  data.return_raw_chat=True actor_rollout_ref.model.path="Qwen3-235B-A22B" actor_rollout_ref.actor.optim.lr=1e-6 \
  +actor_rollout_ref.model.override_config.model_config.max_position_embeddings=32768 \
  actor_rollout_ref.actor.ppo_mini_batch_size=128 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 actor_rollout_ref.ref.megatron.use_dist_checkpointing=False \
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.enable_chunked_prefill=True actor_rollout_ref.rollout.enable_prefix_caching=True \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.megatron.use_mbridge=True \
  +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=11 \
  +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=11 \
  actor_rollout_ref.actor.megatron.use_dist_checkpointing=False actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.tensor_model_parallel_size=8 \
  actor_rollout_ref.rollout.data_parallel_size=8 actor_rollout_ref.rollout.expert_parallel_size=64 \
  actor_rollout_ref.rollout.enable_chunked_prefill=True actor_rollout_ref.rollout.max_num_batched_tokens=1024 \
  actor_rollout_ref.actor.megatron.param_offload=True actor_rollout_ref.actor.megatron.optimizer_offload=True \
  actor_rollout_ref.actor.megatron.grad_offload=True actor_rollout_ref.rollout.gpu_memory_utilization=0.75 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=16 actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=12288 \
  actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=8 actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.ref.megatron.expert_model_parallel_size=4 actor_rollout_ref.ref.megatron.param_offload=True \
  algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console'] trainer.project_name='GRPO' \
  trainer.experiment_name='GRPO-qwen3-235b-megatron-fully-async' trainer.nnodes="${NNODES_TRAIN}" \
  trainer.n_gpus_per_node="${NGPUS_PER_NODE}" trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=100 \
  trainer.device='npu' \
  +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform \
  +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full \
  +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1 \
  actor_rollout_ref.rollout.enforce_eager=False rollout.nnodes="${NNODES_ROLLOUT}" rollout.n_gpus_per_node="${NGPUS_PER_NODE}" \
  rollout.total_rollout_steps=$(((512*400))) trainer.total_epochs=10 async_training.staleness_threshold=0.5 \
  async_training.trigger_parameter_sync_step=1 async_training.require_batches=1 async_training.partial_rollout=True \
  actor_rollout_ref.actor.optim.lr_decay_style='constant' actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.optim.lr_decay_steps=$(((512*400))) actor_rollout_ref.hybrid_engine=False trainer.device='npu' \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes="[8, 16, 32, 64, 128]" \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode="FULL_DECODE_ONLY" 2>&1 | tee "logs/verl_$(date +%Y%m%d_%H%M).log"
