"""asyncrl engine: the runtime of fully asynchronous RL post-training.

Imports torch and ray; vLLM and Megatron only inside their backends. The CLI reaches the engine through
`engine.runtime.driver.run(plan)` (a `RunPlan`, `engine.plan.run_plan`) and the control plane
(`engine.control`) only, plus the light `engine.config` (the schema) and `engine.plan` (shared formulas).
"""
