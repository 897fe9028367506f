"""verl's `BaseTool` (0.6 / 0.7 interface): one object per tool, one instance per trajectory inside it.

`create(instance_id, **kwargs) -> (instance_id, ToolResponse)`, `execute(instance_id, parameters, **kwargs)
-> (ToolResponse, step_reward, metrics)`, `calc_reward(instance_id) -> float`, `release(instance_id)`."""

import json
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op


class BaseTool:
    def __init__(self, config, tool_schema):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        assert self.tool_schema is not None, "Tool schema is not set!"
        if isinstance(self.tool_schema, dict):
            self.tool_schema = OpenAIFunctionToolSchema.model_validate(self.tool_schema)
        self.name = self.tool_schema.function.name
        print(json.dumps(self.tool_schema.model_dump(exclude_none=True), indent=2))

    def get_openai_tool_schema(self):
        return self.tool_schema

    async def create(self, instance_id=None, **kwargs):
        return (instance_id if instance_id is not None else str(uuid4())), ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id, **kwargs):
        return 0.0

    async def release(self, instance_id, **kwargs):
        pass
