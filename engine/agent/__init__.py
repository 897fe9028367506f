"""Multi-turn, tool-using rollouts: the pieces that do not depend on the loop's shells.

- `tool_calls`: parse the model's tool calls out of its text (Hermes-style `<tool_call>{json}</tool_call>`,
  as verl and Qwen use; other formats register beside it).
- `tools`: the tool registry — Python functions with an OpenAI-style JSON schema, importable from verl's
  `tool_config_path` YAML.
- `box`, `box_runner`, `sandbox`: each tool call in a bubblewrap box of its own (own pid, network, mount
  namespaces; read-only system; empty scratch; allow-listed environment; rlimits), killed whole at its
  deadline; a tool that raises, hangs, floods or returns garbage becomes an error text for the model and a
  counted outcome, never an exception in the loop.
- `builtin_tools`: `calculator` and `python` (a code interpreter, as verl's retool).

The per-trajectory decisions (when a turn ends, what is masked, which version produced which token) are a
pure core in `engine.loop.agent`.
"""
