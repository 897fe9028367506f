"""A user reward module that fails while being imported (the launch must stop with one line)."""

raise ImportError("this reward module cannot be imported on purpose")


def score(response_text: str, ground_truth: str) -> float:
    return 0.0
