"""The loop's decisions as pure state machines (sans-I/O): no Ray, torch or clock inside.

`RolloutLoop` (rollout.py, with rollout_agent.py, rollout_validation.py, rollout_checkpoint.py) decides what the rollouter does — admit, dispatch, abort, resubmit prefixes, pause,
schedule validation, account the staleness budget and the queue bound, apply knobs — and `TrainerLoop`
(trainer.py) what the trainer does — how many groups to pull, the hard staleness cap, when to sync, knob
application. Both take events (method calls) and return `commands.Command`s that a shell carries out: the
Ray actors in `engine.runtime` in production, the deterministic simulator in `engine.loop.sim` in tests and
in `asyncrl simulate`. The same code runs in both, so what the simulator proves about it holds for real runs.
"""
