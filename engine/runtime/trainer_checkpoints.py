"""The trainer's checkpoints and weights hash (a mixin of `engine.runtime.trainer_actor.TrainerCore`).

`save_checkpoint` writes the trainer backend's save (weights, optimizer, RNG states), the loop's counters,
the rollout-side cut and the queued groups (`engine.runtime.checkpoint`); `state.json` also records
`weights_sha256`. The hash is

    sha256( for each exported bucket in export order, for each name in sorted order:
            name ‖ dtype ‖ shape ‖ the tensor's bytes (C order) )

over the HF-named arrays `export_weights` yields (the ones the replicas receive), so two runs whose
parameters agree bit for bit have the same hash and any differing bit changes it. It is written at every
checkpoint, and at the end of the run as an event (`kind = "weights"`) and in `fit()`'s result.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import ray

HASH_BUCKET_BYTES = 64 * 2**20


def hash_buckets(buckets: Any) -> str:
    """sha256 of HF-named tensor (or numpy) buckets (see the module docstring): the raw bytes in the
    tensors' own dtype."""
    import torch

    from engine.sync.flat import as_tensor

    h = hashlib.sha256()
    for bucket in buckets:
        for name in sorted(bucket):
            t = as_tensor(bucket[name]).cpu().contiguous()
            h.update(f"{name}\x1f{str(t.dtype).removeprefix('torch.')}\x1f{tuple(t.shape)}\x1f".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class TrainerCheckpoints:
    """Checkpoint and hash methods of `TrainerCore` (uses its loop, backend, rollouter and controller)."""

    def weights_sha256(self) -> str:
        """The hash of the trainer's current parameters (every rank takes part in the export)."""
        return hash_buckets(self.backend.export_weights(HASH_BUCKET_BYTES))

    def report_weights_hash(self) -> str:
        """At the end of the run: the final weights' hash as an event; returned for `fit()`'s result."""
        digest = self.weights_sha256()
        self.controller.record_event.remote(self._ev(
            "info", "weights", f"final weights sha256 {digest} (step {self.local_step}, version {self.version})",
            weights_sha256=digest))
        return digest

    def save_checkpoint(self, reason: str, snapshot: dict | None = None) -> str:
        """Write a checkpoint now (between steps). `snapshot` is a rollout-side cut taken at this step's sync;
        without one the rollouter is paused briefly to take it."""
        from engine.runtime.checkpoint import checkpoint_root, ledger_position, write_checkpoint
        from engine.runtime.resume import config_fingerprint

        if snapshot is None:
            snapshot = ray.get(self.rollouter.snapshot.remote(True))
        state = {
            **self.loop.state(), "reason": reason,
            "time": time.time(), "run_dir": os.path.abspath(self.run_dir),
            "fingerprint": config_fingerprint(self.cfg),
            **ledger_position(self.ledger.path),
            "trainer": {"stale_processed": self.stale_processed, "dropped_stale": self.dropped_stale,
                        "skipped_updates": self.skipped_updates, "elapsed_s": time.time() - self.t0},
            "rollout": snapshot["rollout"],
            "weights_sha256": self.weights_sha256(),
        }
        queued = [g.to_json() for g in self.loop.current + self.loop.buffer] + snapshot["queued"]
        path = write_checkpoint(checkpoint_root(self.cfg, self.run_dir), self.local_step,
                                save_trainer=lambda p: self.backend.save(str(p)), state=state, queued=queued,
                                in_flight=snapshot["in_flight"], keep_last=self.cfg.checkpoint.keep_last)
        self.controller.record_event.remote(self._ev(
            "info", "checkpoint", f"checkpoint saved ({reason}): {path}", path=str(path), reason=reason,
            queued=len(queued), in_flight=len(snapshot["in_flight"]), weights_sha256=state["weights_sha256"]))
        return str(path)

    def _checkpoint_best_effort(self, reason: str) -> None:
        """A stop/final/on-demand/failure checkpoint; a failure is an event, not a crash (the last one stays)."""
        try:
            self.save_checkpoint(reason)
        except Exception as e:  # noqa: BLE001 - reported, and the previous checkpoint remains usable
            self.controller.record_event.remote(self._ev(
                "error", "checkpoint", f"{reason} checkpoint failed: {type(e).__name__}: {e}"))
