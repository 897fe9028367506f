"""The rollout engines a replica runs: `base` (the backend protocol, `SamplingParams`, rollout stats, shared by
both), `hf` (transformers in-process) and `vllm` (vLLM AsyncLLM)."""
