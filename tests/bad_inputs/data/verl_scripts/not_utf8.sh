python3 -m verl.experimental.fully_async_policy.fully_async_main algorithm.adv_estimator=grpo trainer.experiment_name=café
