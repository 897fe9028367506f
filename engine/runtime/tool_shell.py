"""The rollouter's side of multi-turn rollouts: parse a turn's tool calls, run them, hand back the answers.

`RolloutLoop` decides (which turn ends, which calls run, when the next turn is generated); this shell only
does the I/O it cannot: decoding a turn's text to parse its calls, running the calls in the sandbox
(`engine.agent.sandbox.ToolRunner`: each call in a bubblewrap box, concurrently, so other trajectories keep
generating; a stateful verl-style tool's calls go to its trajectory's own long-lived box, `engine.agent.session`,
ended when the core's `ReleaseTools` says the trajectory ended), and rendering the answers as token ids through
the chat template. Every call ends in an answer
for the model — a tool's error, timeout, crash or hit limit becomes its text and a counted status. Where no box
can be built, the shell does not start (`SandboxUnavailable`: the run stops with the reason and the fix)
unless `allow_unsandboxed`.

Metrics (per step, since the last report): `asyncrl/tools/calls`, `asyncrl/tools/errors` and one count per
failure status (`asyncrl/tools/status/{error,timeout,limit,refused}`; a call the
model got wrong (unknown tool, bad arguments, malformed JSON) counts as `error`), the latency
`asyncrl/tools/latency_s/{p50,p99,max}`, `asyncrl/tools/waiting` (trajectories waiting for tools now),
`asyncrl/tools/instances` (stateful tools' boxes alive now: one per trajectory and tool until released). These
count training conversations only; a validation conversation's calls (`CallTools.validation`) run the same
way and are counted in the validation record (`engine.runtime.scoring.validation_record`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from engine.agent.sandbox import STATUSES, ToolOutcome, ToolRunner
from engine.agent.template import tool_answer_ids
from engine.agent.tool_calls import parser
from engine.agent.tools import ToolRegistry, run_tools
from engine.loop.commands import CallTools, ReleaseTools
from engine.types import GenResult


def tool_registry(mt: Any) -> ToolRegistry:
    """The run's tools: verl's tool config when given, else the named built-ins."""
    return run_tools(mt)


class ToolShell:
    def __init__(self, mt: Any, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.registry = tool_registry(mt)
        self.template_kwargs = dict(template_kwargs or {})
        self.parse_text = parser(mt.format)
        self.tokenizer = tokenizer
        self.runner = ToolRunner(mt.max_concurrent_tools, mt.allow_unsandboxed, self.registry.needs_box())
        self._waiting: dict[tuple[str, int, bool], tuple[list[Future[ToolOutcome] | ToolOutcome], float]] = {}
        self._latencies: list[float] = []
        self._counts: dict[str, int] = {}

    def parse(self, results: list[GenResult], turn_start: Any, validation: bool = False) -> dict[str, list[Any]]:
        """The tool calls in the text of every returned turn, by request id (`turn_start(request_id,
        validation)`: where the turn's tokens begin in the response); the loop uses them only for a turn that
        ended."""
        out: dict[str, list[Any]] = {}
        for r in results:
            if r.response_ids:
                start = turn_start(r.request_id, validation)
                text = self.tokenizer.decode(r.response_ids[start:], skip_special_tokens=False)
                out[r.request_id] = self.parse_text(text)
        return out

    def start(self, c: CallTools) -> None:
        work: list[Future[ToolOutcome] | ToolOutcome] = [ToolOutcome("error", e, 0.0) for e in c.errors]
        for call in c.calls:
            problem = self.registry.check(call)
            if problem is not None:
                work.append(ToolOutcome("error", problem, 0.0))
                continue
            tool = self.registry.tools[call.name]
            row = c.tools_kwargs.get(call.name) or {}
            hidden = row.get("create_kwargs") or {}
            if tool.stateful:  # verl's interface: create_kwargs go to `create`, the arguments to `execute`
                work.append(self.runner.submit_stateful((c.uid, c.index, c.validation), tool, call.arguments,
                                                        row))
            else:
                work.append(self.runner.submit(tool.function, {**call.arguments, **hidden}, tool.limits,
                                               tool.service))
        self._waiting[(c.uid, c.index, c.validation)] = (work, time.monotonic())

    def ready(self) -> list[tuple[str, int, list[int], bool]]:
        """(uid, index, answer token ids, validation) of every trajectory (or validation conversation) whose
        calls have all answered."""
        done: list[tuple[str, int, list[int], bool]] = []
        for key, (work, _) in list(self._waiting.items()):
            if any(isinstance(w, Future) and not w.done() for w in work):
                continue
            del self._waiting[key]
            outcomes = [w.result() if isinstance(w, Future) else w for w in work]
            for o in (outcomes if not key[2] else []):  # validation's calls are in its own record
                self._count("calls")
                if not o.ok:
                    self._count("errors")
                    self._count(o.status)
                self._latencies.append(o.seconds)
            texts = [o.text if o.ok else f"Error: {o.text}" for o in outcomes]
            done.append((key[0], key[1], tool_answer_ids(self.tokenizer, texts, self.template_kwargs), key[2]))
        return done

    def counters(self) -> dict[str, float]:
        lat = sorted(self._latencies)
        out: dict[str, float] = {"asyncrl/tools/calls": self._counts.get("calls", 0),
                                 "asyncrl/tools/errors": self._counts.get("errors", 0),
                                 "asyncrl/tools/waiting": sum(1 for key in self._waiting if not key[2]),
                                 "asyncrl/tools/instances": self.runner.instances()}
        for status in STATUSES[1:]:
            out[f"asyncrl/tools/status/{status}"] = self._counts.get(status, 0)
        if lat:
            out["asyncrl/tools/latency_s/p50"] = lat[len(lat) // 2]
            out["asyncrl/tools/latency_s/p99"] = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            out["asyncrl/tools/latency_s/max"] = lat[-1]
        self._latencies, self._counts = [], {}
        return out

    def release(self, c: ReleaseTools) -> None:
        """These trajectories ended: their stateful tools' instances are released and their boxes killed."""
        self.runner.release(list(c.trajectories))

    def close(self) -> None:
        """The rollouter stops: every tool box is killed."""
        self.runner.close()

    def _count(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
