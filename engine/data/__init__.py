"""Datasets and rewards: built-in task generators (`builtin`), verl-format parquet reading (`parquet`), the
tokenised prompt stream (`prompts`), reward functions (`rewards`, `math_answer`).

Nothing is imported here, so `engine.data.builtin` stays importable without torch or transformers.
"""
