"""A user reward function that returns a string instead of a number (scored 0.0, counted, logged)."""


def score(response_text: str, ground_truth: str) -> str:
    return "very good"
