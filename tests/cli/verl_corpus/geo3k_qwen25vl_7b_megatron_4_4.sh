# asyncrl conformance corpus: the overrides of verl's
#   verl/experimental/fully_async_policy/shell/geo3k_qwen25vl_7b_megatron_4_4.sh @ verl-project/verl 1dda039b9c6311889a9c9a26040677e1254814f9
# written out as key=value facts (as the importer's shell reader resolves them); not a copy of the script.
n_gpus_rollout=4
n_gpus_training=4
NGPUS_PER_NODE='${NGPUS_PER_NODE:-8}'
python \
  -m \
  verl.experimental.fully_async_policy.fully_async_main \
  --config-path=config \
  --config-name=fully_async_ppo_megatron_trainer.yaml \
  algorithm.adv_estimator=grpo \
  'data.train_files=${HOME}/data/geo3k/train.parquet' \
  'data.val_files=${HOME}/data/geo3k/test.parquet' \
  data.train_batch_size=0 \
  data.max_prompt_length=1024 \
  data.max_response_length=2048 \
  actor_rollout_ref.rollout.max_model_len=32768 \
  actor_rollout_ref.rollout.max_num_batched_tokens=32768 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.gen_batch_size=1 \
  data.return_raw_chat=True \
  'actor_rollout_ref.model.path=${HF_MODEL_PATH:-${RAY_DATA_HOME}/models/Qwen2.5-VL-7B-Instruct}' \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.lr_decay_steps=51200 \
  actor_rollout_ref.hybrid_engine=False \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.actor.ppo_mini_batch_size=128 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.01 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=5120 \
  actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
  actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=5120 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=5120 \
  actor_rollout_ref.rollout.name=vllm
