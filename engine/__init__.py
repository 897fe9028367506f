"""asyncrl engine: the runtime of fully asynchronous RL post-training.

Imports torch and ray; vLLM and Megatron only inside their backends. The CLI reaches the engine through
`engine.runtime.driver.run(config)` and the controller client only.
"""
