# A launch line whose arithmetic divides by zero (bash would stop: "division by 0").
steps=$((512 / 0))
python3 -m verl.experimental.fully_async_policy.fully_async_main algorithm.adv_estimator=grpo rollout.total_rollout_steps=$steps
