"""Deterministic simulation of the loop: the real `RolloutLoop` and `TrainerLoop` driven by simulated
replicas, queue, trainer and operator, in simulated time, from one seed (`scenario.py` draws scenarios,
`world.py` runs one, `checks.py` holds the properties checked after every event and at the end)."""
