"""config.json files of the models the shipped presets and verl's fully-async scripts use (Qwen3-8B-Base: the
released file), so `validate` can size them offline (DeepSeek-V3,
Kimi-K2-Instruct, Qwen3-Coder-480B-A35B-Instruct and Qwen3-235B-A22B: the architecture fields the parameter count
and the memory model read, as `tests/config/released_configs.py` types them from the released files)."""
