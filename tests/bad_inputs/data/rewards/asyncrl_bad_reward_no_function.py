"""A user reward module without the function the config names."""


def some_other_name(response_text: str, ground_truth: str) -> float:
    return 0.0
