# An epoch count no integer can hold.
python3 -m verl.experimental.fully_async_policy.fully_async_main algorithm.adv_estimator=grpo trainer.total_epochs=1e999
