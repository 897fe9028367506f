# asyncrl conformance corpus: the overrides of verl's
#   verl/experimental/fully_async_policy/shell/dapo_7b_async_retool.sh @ verl-project/verl 418fb3ad226b625c3b69cbeab5ca2597de3ae4b8
# written out as key=value facts (multi-turn with tools, a custom dataset class and reward); not a copy of it.
DATA_ROOT=${DATA_ROOT:-$PWD}
retool_path=recipe/retool/retool.py
NNODES=${NNODES:-1}
NGPUS_PER_NODE=${NGPUS_PER_NODE:-8}
n_gpus_rollout=4
n_gpus_training=$((NGPUS_PER_NODE - n_gpus_rollout))
python3 -m verl.experimental.fully_async_policy.fully_async_main \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False algorithm.kl_ctrl.kl_coef=0.0 \
  data.train_files="['$DATA_ROOT/dataset/BytedTsinghua-SIA/DAPO-Math-17k']" \
  data.val_files="['$DATA_ROOT/dataset/yentinglin/aime_2025', '$DATA_ROOT/dataset/Maxwell-Jia/AIME_2024']" \
  data.return_raw_chat=True data.train_batch_size=0 data.max_prompt_length=2048 data.max_response_length=16384 \
  data.filter_overlong_prompts=True data.truncation='error' \
  data.custom_cls.path=$retool_path data.custom_cls.name=CustomRLHFDataset \
  reward.custom_reward_function.path=$retool_path reward.custom_reward_function.name=compute_score \
  actor_rollout_ref.hybrid_engine=False \
  actor_rollout_ref.model.path=$DATA_ROOT/checkpoint/multiturn-sft-qwen-2.5-7b-instruct/global_step_372 \
  actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.clip_ratio_c=10.0 \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_max_token_len_per_gpu=18432 \
  actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 critic.strategy=fsdp2 actor_rollout_ref.actor.fsdp_config.fsdp_size=4 \
  actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=73728 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
  actor_rollout_ref.rollout.multi_turn.enable=True actor_rollout_ref.rollout.multi_turn.max_user_turns=16 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=16 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path=recipe/retool/sandbox_fusion_tool_config.yaml \
  actor_rollout_ref.rollout.multi_turn.format=hermes actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
  actor_rollout_ref.rollout.n=16 actor_rollout_ref.rollout.val_kwargs.top_p=0.6 \
  actor_rollout_ref.rollout.val_kwargs.temperature=1.0 actor_rollout_ref.rollout.val_kwargs.n=30 \
  actor_rollout_ref.rollout.calculate_log_probs=True trainer.logger=['console','tensorboard'] trainer.project_name=retool \
  trainer.experiment_name=qwen2.5-7b_dapo_async_tool trainer.val_before_train=True trainer.log_val_generations=20 \
  trainer.save_freq=-1 trainer.default_local_dir=$DATA_ROOT/checkpoint/qwen2.5-7b_dapo_async_tool data.gen_batch_size=1 \
  trainer.nnodes=$NNODES trainer.n_gpus_per_node=$n_gpus_training rollout.nnodes=$NNODES rollout.n_gpus_per_node=$n_gpus_rollout \
  rollout.total_rollout_steps=$(((64*250))) rollout.total_epochs=10 rollout.test_freq=10 \
  async_training.staleness_threshold=0.5 async_training.trigger_parameter_sync_step=4 async_training.require_batches=1 \
  async_training.partial_rollout=True
