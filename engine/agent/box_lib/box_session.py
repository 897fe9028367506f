"""A stateful verl-style tool inside its box: one object, one instance, many calls, until release.

Started by `engine.agent.box_runner` (limits already set) when its request carries `session`: `module` and
`function` name the tool's file and class, `session` its verl `config`, `schema` (the YAML's `tool_schema`) and
`instance_id`. The class is instantiated as verl does (`cls(config=..., tool_schema=OpenAIFunctionToolSchema)`;
`verl.*` comes from the shim beside this file), answered `ready`, then ops arrive one JSON line each on stdin:
- `{"op": "create", "kwargs": {...}}` → `await tool.create(instance_id, **create_kwargs,
  create_kwargs=create_kwargs)` (both of verl's conventions: its sglang rollout spreads them, its agent loop
  passes `create_kwargs=`); a returned id (verl ≤ 0.5: a string, ≥ 0.6: `(id, ToolResponse)`) is kept;
- `{"op": "execute", "arguments": {...}, "kwargs": {...}}` → `await tool.execute(instance_id, arguments,
  **execute_kwargs)`; the answer is the
  response's text (a string, verl 0.4.1's `{"text": ...}`, or a `ToolResponse`), cut at `max_output_chars`, with
  the step reward when it returned one; images and videos are dropped (said in the text);
- `{"op": "release", "kwargs": {...}}` → `await tool.release(instance_id, **release_kwargs)`, answered, then
  the box exits.
Each op's answer is one JSON line on the answer pipe (`status`, `text`, `limit`, `reward`, `fatal`). A tool that
raises an `Exception` gets an `error` answer and keeps its state; one that runs out of memory or CPU, recurses
too deep or exits answers with `fatal: true` and the box ends (its state is gone). What the tool prints is
dropped (verl shows the model the returned response only). Coroutines run on one event loop kept for the
box's life.
"""

import asyncio
import importlib
import json
import os
import sys


def _text(resp, cap, truncate):
    """The answer text of an `execute` response."""
    if resp is None:
        return ""
    if isinstance(resp, str):
        return truncate(resp, cap)
    get = resp.get if isinstance(resp, dict) else (lambda k: getattr(resp, k, None))
    text = get("text")
    media = [k for k in ("image", "video") if get(k)]
    out = truncate("" if text is None else str(text), cap)
    return out + (f"\n[{' and '.join(media)} dropped: asyncrl's tools answer text]" if media else "")


def serve(req, cap, runner):
    """Run the session (see the module docstring); never returns."""
    sess = req["session"]
    loop = asyncio.new_event_loop()

    def run(label, thunk):
        """(ok, value) of one op; a failure is answered here, a fatal one ends the box."""
        sys.stdout = sys.stderr = runner.Capture(cap)
        try:
            value = thunk()
            if asyncio.iscoroutine(value):
                value = loop.run_until_complete(value)
            return True, value
        except BaseException as e:  # noqa: BLE001 - every failure of the tool is its answer
            status, text, limit = runner._failure(e, cap)
            fatal = not isinstance(e, Exception) or isinstance(e, (MemoryError, RecursionError))
            runner._send(status, f"{label}: {text}", limit, fatal=fatal)
            if fatal:
                os._exit(0)
            return False, None

    def load():
        from verl.tools.schemas import OpenAIFunctionToolSchema

        cls = getattr(importlib.import_module(req["module"]), req["function"])
        return cls(config=sess.get("config") or {}, tool_schema=OpenAIFunctionToolSchema.model_validate(
            sess["schema"]))

    ok, tool = run("loading the tool", load)
    if not ok:
        os._exit(0)
    runner._send("ok", "ready")
    instance_id = str(sess["instance_id"])
    while True:
        line = sys.stdin.buffer.readline(64 * 1024 * 1024)
        if not line:
            os._exit(0)
        op = json.loads(line.decode("utf-8", errors="replace"))
        if op["op"] == "create":
            kwargs = dict(op.get("kwargs") or {})
            kwargs.setdefault("create_kwargs", dict(kwargs))
            ok, value = run("create", lambda: tool.create(instance_id, **kwargs))
            if ok:
                value = value[0] if isinstance(value, tuple) and value else value
                instance_id = str(value) if isinstance(value, (str, int)) else instance_id
                runner._send("ok", "created")
        elif op["op"] == "execute":
            ok, value = run("execute", lambda: tool.execute(instance_id, op["arguments"], **(op.get("kwargs") or {})))
            if ok:
                resp, reward = (value[0], value[1] if len(value) > 1 else None) if isinstance(value, tuple) \
                    else (value, None)
                reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) \
                    else None
                runner._send("ok", _text(resp, cap, runner._truncate), reward=reward)
        else:
            run("release", lambda: tool.release(instance_id, **(op.get("kwargs") or {})))
            runner._send("ok", "released")
            os._exit(0)
