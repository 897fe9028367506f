"""A user reward function that raises on every call (the run must go on: scored 0.0, counted, logged)."""


def score(response_text: str, ground_truth: str) -> float:
    raise RuntimeError("this reward function is broken on purpose")
