"""`rollout_trace_op`: verl's tracing decorator; in the box there is no trace, so it returns the function."""


def rollout_trace_op(func):
    return func
