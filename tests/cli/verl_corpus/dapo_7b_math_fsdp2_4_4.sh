# asyncrl conformance corpus: the overrides of verl's
#   verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh @ verl-project/verl 418fb3ad226b625c3b69cbeab5ca2597de3ae4b8
# written out as key=value facts; not a copy of the script.
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-Math-7B"}
NNODES=${NNODES:-1}
NGPUS_PER_NODE=${NGPUS_PER_NODE:-8}
n_gpus_rollout=4
n_gpus_training=$((NGPUS_PER_NODE - n_gpus_rollout))
python -m verl.experimental.fully_async_policy.fully_async_main \
  data.train_files="${RAY_DATA_HOME}/data/dapo-math-17k.parquet" data.val_files="${RAY_DATA_HOME}/data/aime-2024.parquet" \
  data.prompt_key=prompt data.truncation='left' data.max_prompt_length=2048 data.max_response_length=8192 \
  data.train_batch_size=0 data.gen_batch_size=1 data.return_raw_chat=True \
  actor_rollout_ref.rollout.n=16 algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False algorithm.kl_ctrl.kl_coef=0.0 \
  actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 critic.strategy=fsdp2 \
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.clip_ratio_c=10.0 \
  actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.hybrid_engine=False \
  +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \
  actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480 \
  actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30720 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720 \
  actor_rollout_ref.model.path="${MODEL_PATH}" actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=10 actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.grad_clip=1.0 actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.enable_chunked_prefill=True \
  actor_rollout_ref.rollout.max_num_batched_tokens=10240 actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1 actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  actor_rollout_ref.rollout.val_kwargs.top_p=0.7 actor_rollout_ref.rollout.val_kwargs.top_k=-1 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.rollout.val_kwargs.n=1 \
  actor_rollout_ref.rollout.calculate_log_probs=True actor_rollout_ref.ref.fsdp_config.param_offload=True \
  actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 actor_rollout_ref.actor.fsdp_config.fsdp_size=2 \
  actor_rollout_ref.rollout.name=vllm reward.reward_manager.name=dapo \
  +reward.reward_kwargs.overlong_buffer_cfg.enable=True +reward.reward_kwargs.overlong_buffer_cfg.len=4096 \
  +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 +reward.reward_kwargs.overlong_buffer_cfg.log=False \
  +reward.reward_kwargs.max_resp_len=8192 trainer.logger=['console','tensorboard'] trainer.project_name='DAPO' \
  trainer.experiment_name='DAPO-Qwen2.5-7b-MATH-0527a1-fsdp2-fully-async-4-4' trainer.val_before_train=False \
  trainer.save_freq=-1 trainer.default_local_dir="${RAY_DATA_HOME}/ckpts/DAPO/4-4" trainer.resume_mode=auto \
  trainer.nnodes="${NNODES}" trainer.n_gpus_per_node="${n_gpus_training}" rollout.nnodes="${NNODES}" \
  rollout.n_gpus_per_node="${n_gpus_rollout}" rollout.total_rollout_steps=51200 rollout.total_epochs=10 \
  rollout.test_freq=10 async_training.staleness_threshold=0.1 async_training.trigger_parameter_sync_step=4 \
  async_training.require_batches=4 async_training.partial_rollout=True
