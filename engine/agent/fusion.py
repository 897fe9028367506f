"""The code interpreter on a SandboxFusion service (verl's retool backend), when the user names one.

verl's `SandboxFusionTool` posts the code to `sandbox_fusion_url` (`http://HOST:PORT/run_code`), a containerised
service the user runs. A tool whose verl config names that URL runs there, through the service's own client
(PyPI `sandbox-fusion`: `run_code(RunCodeRequest, endpoint, max_attempts, client_timeout)`), never silently on
the local box. Per call: `run_timeout` = the tool's `timeout_s`; the HTTP request may take `timeout_s + 10` s;
transport and service errors are retried (`retries` attempts, the client's exponential jitter); at most
`max_concurrent` calls per URL are in flight (verl's `num_workers`), the rest wait for a slot.

Outcomes, as for the box (`engine.agent.sandbox.ToolOutcome`): `ok` (exit 0: stdout, then stderr if any);
`error` (non-zero exit or a compile error: the output tail); `timeout` (the service's TimeLimitExceeded);
`refused` (the client is not installed, or the service could not be reached / answered SandboxError after
every retry). Never raises.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from engine.agent.sandbox import SandboxLimits, ToolOutcome

_SLOTS: dict[str, threading.BoundedSemaphore] = {}
_LOCK = threading.Lock()
HTTP_SLACK_S = 10.0


@dataclass(frozen=True)
class FusionService:
    """A SandboxFusion endpoint (verl's `sandbox_fusion_url`, ending in `/run_code` or not)."""

    url: str
    retries: int = 3
    max_concurrent: int = 10
    language: str = "python"

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/").removesuffix("/run_code")


def _slot(service: FusionService) -> threading.BoundedSemaphore:
    with _LOCK:
        return _SLOTS.setdefault(service.endpoint, threading.BoundedSemaphore(service.max_concurrent))


def _clip(text: str, cap: int) -> str:
    return text if len(text) <= cap else text[:cap] + f"\n… [output truncated at {cap} characters]"


def run_fusion(service: FusionService, code: str, limits: SandboxLimits) -> ToolOutcome:
    """Run `code` on the service; waits for a slot, then at most ~`retries` × (`timeout_s` + 10 s)."""
    t0 = time.monotonic()
    try:
        from sandbox_fusion import RunCodeRequest, run_code
    except ImportError:
        return ToolOutcome("refused", "the SandboxFusion client is not installed (pip install sandbox-fusion)", 0.0)
    with _slot(service):
        try:
            req = RunCodeRequest(code=str(code), language=service.language, run_timeout=limits.timeout_s)
            resp = run_code(req, endpoint=service.endpoint, max_attempts=service.retries,
                            client_timeout=limits.timeout_s + HTTP_SLACK_S)
        except Exception as e:  # noqa: BLE001 - the client raises bare Exceptions after its retries
            why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
            return ToolOutcome("refused", f"SandboxFusion at {service.endpoint} failed: {why}",
                               time.monotonic() - t0)
    seconds = time.monotonic() - t0
    run = resp.run_result or resp.compile_result
    if run is None:
        return ToolOutcome("error", f"SandboxFusion answered {resp.status}: {resp.message}"[:300], seconds)
    out = (run.stdout or "") + (("\n" if run.stdout else "") + run.stderr if run.stderr else "")
    status = str(getattr(run.status, "value", run.status))
    if status == "TimeLimitExceeded":
        return ToolOutcome("timeout", f"tool timed out after {limits.timeout_s:g} s", seconds, "time")
    if resp.run_result is None or run.return_code not in (0, None) or status != "Finished":
        return ToolOutcome("error", _clip(out.strip() or f"exit {run.return_code}", limits.max_output_chars),
                           seconds)
    return ToolOutcome("ok", _clip(out, limits.max_output_chars), seconds)
