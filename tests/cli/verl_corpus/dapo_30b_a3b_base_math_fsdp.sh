# asyncrl conformance corpus: the overrides of verl's
#   verl/experimental/fully_async_policy/shell/dapo_30b_a3b_base_math_fsdp.sh @ verl-project/verl 418fb3ad226b625c3b69cbeab5ca2597de3ae4b8
# written out as key=value facts (submitted through `ray job submit`, as the script does); not a copy of it.
DATA_PATH=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${DATA_PATH}/shared/models/Qwen3-30B-A3B-Base"}
n_gpus_rollout=8
n_gpus_training=8
n_nodes_rollout=2
n_nodes_train=2
train_bsz=512
train_prompt_mini_bsz=32
require_batches=1
ray job submit --no-wait --runtime-env="${WORKING_DIR}/verl/trainer/runtime_env.yaml" --address "${RAY_ADDRESS}" \
  -- python3 -m verl.experimental.fully_async_policy.fully_async_main --config-path=config \
  --config-name='fully_async_dapo_trainer.yaml' \
  data.train_files="${DATA_PATH}/shared/data/dapo-math/dapo-math-17k.parquet" \
  data.val_files="${DATA_PATH}/shared/data/dapo-math/aime-2024.parquet" data.prompt_key=prompt data.truncation='left' \
  actor_rollout_ref.actor.fsdp_config.strategy=fsdp critic.strategy=fsdp \
  data.max_prompt_length=2048 data.max_response_length=20480 data.train_batch_size=0 data.gen_batch_size=1 \
  data.return_raw_chat=True actor_rollout_ref.rollout.n=16 algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False algorithm.kl_ctrl.kl_coef=0.0 actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.nccl_timeout=72000 actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.clip_ratio_c=10.0 \
  actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.hybrid_engine=False \
  +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \
  actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22528 \
  actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=22528 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=22528 \
  actor_rollout_ref.model.path="${MODEL_PATH}" actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=10 actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_mini_bsz} actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.grad_clip=1.0 actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 actor_rollout_ref.rollout.gpu_memory_utilization=0.50 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.enable_chunked_prefill=True \
  +actor_rollout_ref.rollout.enable_sleep_mode=False actor_rollout_ref.rollout.max_num_batched_tokens=22528 \
  actor_rollout_ref.rollout.enforce_eager=False actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.top_k=-1 actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  actor_rollout_ref.rollout.val_kwargs.top_p=0.7 actor_rollout_ref.rollout.val_kwargs.top_k=-1 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.rollout.val_kwargs.n=1 \
  actor_rollout_ref.ref.fsdp_config.param_offload=True actor_rollout_ref.ref.ulysses_sequence_parallel_size=4 \
  actor_rollout_ref.actor.fsdp_config.fsdp_size=-1 actor_rollout_ref.rollout.name=vllm reward.reward_manager.name=dapo \
  +reward.reward_kwargs.overlong_buffer_cfg.enable=True +reward.reward_kwargs.overlong_buffer_cfg.len=4096 \
  +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 +reward.reward_kwargs.overlong_buffer_cfg.log=False \
  +reward.reward_kwargs.max_resp_len=20480 trainer.logger=['console','wandb'] \
  trainer.project_name='DAPO-Qwen3-30B-A3B-Base-Async' trainer.experiment_name="Fsdp2-tp4sp4-i16_t16_s0.6" \
  trainer.val_before_train=True trainer.test_freq=25 trainer.save_freq=-1 \
  trainer.default_local_dir="${DATA_PATH}/ckpts/dapo-30b" trainer.resume_mode=auto \
  trainer.nnodes="${n_nodes_train}" trainer.n_gpus_per_node="${n_gpus_training}" rollout.nnodes="${n_nodes_rollout}" \
  rollout.n_gpus_per_node="${n_gpus_rollout}" rollout.total_rollout_steps=$((train_bsz * 400)) rollout.test_freq=25 \
  rollout.total_epochs=10 async_training.require_batches=${require_batches} async_training.staleness_threshold=0.6 \
  async_training.trigger_parameter_sync_step=$((train_bsz / (train_prompt_mini_bsz * require_batches))) \
  async_training.partial_rollout=True
