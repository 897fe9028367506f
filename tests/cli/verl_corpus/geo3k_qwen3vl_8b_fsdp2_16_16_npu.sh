# asyncrl conformance corpus: the overrides of verl's
#   verl/experimental/fully_async_policy/shell/geo3k_qwen3vl_8b_fsdp2_16_16_npu.sh @ verl-project/verl 4b77818f3fafe001626ade023307736a78f90d78
# written out as key=value facts, in named blocks as the script has them; not a copy of the script.
HF_MODEL_PATH=${HF_MODEL_PATH:-"/home/share/Qwen3-VL-4B-Instruct"}
n_gpus_rollout=4
n_gpus_training=12
DATA_CONFIG="data.train_files=/home/chagao/data/geo3k/train.parquet data.val_files=/home/chagao/data/geo3k/test.parquet
  data.train_batch_size=0 data.gen_batch_size=1 data.max_prompt_length=1024 data.max_response_length=2048
  data.filter_overlong_prompts=True data.truncation='error' data.image_key=images data.shuffle=False data.return_raw_chat=True"
ACTOR_CONFIG="actor_rollout_ref.model.path=${HF_MODEL_PATH} actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.model.use_fused_kernels=False actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.model.enable_activation_offload=False actor_rollout_ref.hybrid_engine=False
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64
  actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.01 actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.entropy_from_logits_with_chunking=True
  actor_rollout_ref.actor.fsdp_config.reshard_after_forward=True actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=True
  actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.actor.fsdp_config.forward_prefetch=True"
REF_CONFIG="actor_rollout_ref.ref.fsdp_config.reshard_after_forward=True actor_rollout_ref.ref.fsdp_config.forward_prefetch=True
  actor_rollout_ref.ref.fsdp_config.param_offload=False actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
  actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16384"
ROLLOUT_CONFIG="actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.8
  actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.calculate_log_probs=True
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384 actor_rollout_ref.rollout.max_model_len=32768
  actor_rollout_ref.rollout.max_num_batched_tokens=32768 +actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb=0"
ALGORITHM_CONFIG="algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False
  algorithm.rollout_correction.rollout_is=sequence algorithm.rollout_correction.rollout_is_threshold=2.0
  algorithm.rollout_correction.rollout_is_batch_normalize=true algorithm.rollout_correction.rollout_rs=token_k1
  algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6"
TRAINER_CONFIG="trainer.critic_warmup=0 trainer.logger='console' trainer.project_name='verl_grpo_example_geo3k'
  trainer.experiment_name='qwen3_vl_8b_fsdp2_async' trainer.nnodes=1 trainer.n_gpus_per_node=${n_gpus_training}
  rollout.nnodes=1 rollout.n_gpus_per_node=${n_gpus_rollout} trainer.resume_mode=auto trainer.val_before_train=False
  trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=200 rollout.total_rollout_steps=$(( 512 * 100 ))"
ASYNC_CONFIG="async_training.staleness_threshold=0.1 async_training.trigger_parameter_sync_step=4
  async_training.require_batches=2 async_training.partial_rollout=True"
python3 -m verl.experimental.fully_async_policy.fully_async_main --config-path=config \
  --config-name='fully_async_ppo_trainer.yaml' \
  $DATA_CONFIG $ACTOR_CONFIG $REF_CONFIG $ROLLOUT_CONFIG $ALGORITHM_CONFIG $TRAINER_CONFIG $ASYNC_CONFIG
