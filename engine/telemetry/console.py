"""The live progress line in the launching terminal: step, reward, staleness, tokens/s, version, ETA."""

from __future__ import annotations

import sys
import time
from typing import Any


def _fmt_eta(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "--:--"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def progress_line(rec: dict[str, Any], total_steps: int, started: float) -> str:
    step = int(rec.get("training/global_step", 0))
    elapsed = time.time() - started
    eta = elapsed / step * (total_steps - step) if step else float("nan")
    return (f"step {step}/{total_steps}  v{int(rec.get('fully_async/count/current_param_version', 0))}  "
            f"reward {rec.get('critic/rewards/mean', float('nan')):.3f}  "
            f"staleness {rec.get('asyncrl/staleness/mean', 0.0):.2f}/{rec.get('asyncrl/staleness/max', 0)}  "
            f"train {rec.get('asyncrl/trainer/tokens_per_s', 0.0):.0f} tok/s  "
            f"rollout {rec.get('asyncrl/rollout/tokens_per_s', 0.0):.0f} tok/s  "
            f"queue {rec.get('fully_async/monitor/queue/mq_queue_size', 0)}  "
            f"elapsed {_fmt_eta(elapsed)}  eta {_fmt_eta(eta)}")


class ConsoleProgress:
    """Prints training records as they arrive (one line per step when not a TTY, a live line on a TTY)."""

    def __init__(self, total_steps: int, enabled: bool = True, stream=None) -> None:
        self.total_steps = total_steps
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.started = time.time()
        self.tty = self.stream.isatty()
        self._last_print = 0.0

    def update(self, records: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        for ev in events:
            if ev.get("level") in ("warning", "error") or ev.get("kind") in ("validation", "knob", "checkpoint"):
                self._print(f"[{ev.get('level', 'info')}] {ev.get('message', '')}")
        train = [r for r in records if "critic/rewards/mean" in r]
        if not train:
            return
        line = progress_line(train[-1], self.total_steps, self.started)
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
        elif now - self._last_print >= 5.0 or int(train[-1].get("training/global_step", 0)) >= self.total_steps:
            self._last_print = now
            self._print(line)

    def _print(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
