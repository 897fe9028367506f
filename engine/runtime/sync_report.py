"""What one weight sync reports: its metrics and its `sync` event, from the trainer's timings and the delivery
check's `DeliveryReport` (`engine.sync.verify`).

`asyncrl/sync/verified` and the event's `verified` are the report's fraction (replicas that loaded exactly what
was sent, with effect / replicas that reported; 0 when none did) — so a delivery that failed, or was never
checked, can never read as verified.
"""

from __future__ import annotations

from typing import Any

from engine.sync.verify import DeliveryReport


def sync_metrics(total_s: float, nbytes: int, export_s: float, report: DeliveryReport, buckets: int) -> dict:
    """The sync's metric record entries (besides the transport's own pause / transfer / stage timings)."""
    return {"timing_s/param_sync": total_s, "asyncrl/sync/bytes": nbytes, "asyncrl/sync/export_s": export_s,
            "asyncrl/sync/verified": report.verified, "asyncrl/sync/buckets": buckets}


def sync_event(version: int, out: dict[str, Any], report: DeliveryReport, interval: int,
               transport: str) -> tuple[str, dict[str, Any]]:
    """The `sync` event's message and fields."""
    nbytes, total = out["asyncrl/sync/bytes"], out["timing_s/param_sync"]
    where = ("verified on every replica" if report.verified == 1.0 else
             f"verified on {report.replicas - report.ineffective} of {report.replicas} replica(s)")
    message = (f"weights v{version} pushed: {nbytes / 2**20:.1f} MiB in {total:.2f}s ({_staged(out)}pause "
               f"{out['asyncrl/sync/pause_s']:.2f}s, transfer {out['asyncrl/sync/transfer_s']:.2f}s), {where}")
    return message, {"bytes": nbytes, "seconds": total, "pause_s": out["asyncrl/sync/pause_s"],
                     "transfer_s": out["asyncrl/sync/transfer_s"], "stage_s": out.get("asyncrl/sync/stage_s", 0.0),
                     "interval": interval, "verified": report.verified, "replicas_verified": report.replicas,
                     "workers_verified": report.workers, "buckets": out["asyncrl/sync/buckets"],
                     "transport": transport}


def _staged(out: dict[str, Any]) -> str:
    """"staged 0.41s while generating, " for a sync received into back buffers (`engine.sync.staging`)."""
    if not out.get("asyncrl/sync/staged"):
        return ""
    return f"staged {out.get('asyncrl/sync/stage_s', 0.0):.2f}s while generating, "
