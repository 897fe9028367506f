"""The prompt ledger: every admitted prompt of the run ends in exactly one line of `ledger.jsonl` —
`trained`, `dropped` (with a reason) or `in_flight_at_end` — so a run's data accounting can be audited."""

from __future__ import annotations

import json
import time
from pathlib import Path


class Ledger:
    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "ledger.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", buffering=1)

    def record(self, uids: list[str], status: str, *, step: int, version: int, reason: str | None = None) -> None:
        now = time.time()
        for uid in uids:
            rec = {"uid": uid, "status": status, "step": step, "version": version, "time": now}
            if reason:
                rec["reason"] = reason
            self._f.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        self._f.close()


def read_ledger(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
