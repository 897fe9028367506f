"""A stand-in for the few names of verl that a verl-style tool file imports, bound read-only into a tool's box
(verl itself is neither installed here nor in the box). Standard library only: it runs under the box's
`python -I -S`. It matches verl 0.6 / 0.7's tool interface (`verl.tools.base_tool.BaseTool`,
`verl.tools.schemas.OpenAIFunctionToolSchema` and `ToolResponse`, `verl.utils.rollout_trace.rollout_trace_op`);
tools written for verl 0.4 / 0.5 (`create` returning the instance id, `execute` returning text) run too —
`engine.agent.box_runner` accepts either return shape."""

__version__ = "0.7.0+asyncrl-box-shim"
