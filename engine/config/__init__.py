"""The run configuration's schema, on the engine side of the boundary: `schema` (`RunConfig` and its
sections, pydantic), `sections` (model, data, resources, optimizer, trainer, rollout), `names` (the closed
vocabularies, no pydantic). This `__init__` imports nothing, so `engine.config.names` stays cheap.
"""
