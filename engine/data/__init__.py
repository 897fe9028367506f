"""Datasets and rewards: built-in task generators (`builtin`, the figure task in `figures`), verl-format
parquet reading (`parquet`), the tokenised prompt stream (`prompts`, its image side in `image_rows`), the
Geometry3K converter (`geo3k`), reward functions (`rewards`, `math_answer`).

Nothing is imported here, so `engine.data.builtin` stays importable without torch or transformers.
"""
