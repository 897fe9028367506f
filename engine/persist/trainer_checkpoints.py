"""The trainer's checkpoints and weights hash (a mixin of `engine.runtime.trainer_actor.TrainerCore`).

`save_checkpoint` writes the trainer backend's save (weights, optimizer, RNG states), the loop's counters,
the rollout-side cut and the queued groups (`engine.persist.checkpoint`); `state.json` also records
`weights_sha256`. A checkpoint taken between two syncs (`since_sync > 0`, a stop or on-demand one) by a trainer
that keeps the version's weights θ_v (the snapshot of the last sync: decoupled or deterministic mode) writes θ_v
beside the live weights (`save_version`; `state.json`'s `version_weights`), and a resume restores it
(`load_version`) as the snapshot the replicas are given (`TrainerSync.push_version`) and π_prox is. The hash is

    sha256( for each exported bucket in export order, for each name in sorted order:
            name ‖ dtype ‖ shape ‖ the tensor's bytes (C order) )

over the HF-named arrays `export_weights` yields (the ones the replicas receive), so two runs whose
parameters agree bit for bit have the same hash and any differing bit changes it. It is written at every
checkpoint, and at the end of the run as an event (`kind = "weights"`) and in `fit()`'s result.

A stop with a deadline (`request_stop(..., deadline=)`, from the driver's grace period) writes the full
checkpoint when it fits and a light one otherwise (`engine.persist.stop_grace`: the step's stream position,
queue and in-flight prompts with the trainer state of the last full checkpoint); `stop_state` says which, for
`fit()`'s result. The final hash is not recomputed under a deadline (the checkpoint's is reported).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

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
    """Checkpoint and hash methods of `TrainerCore` (uses its spec, loop, backend, rollouter and controller)."""

    _stop_deadline: float | None = None  # time.time() by which a stop's state must be on disk
    _stop_weight_bytes: int = 0  # the model's weight bytes, for the prior of a full checkpoint's time
    _full_ckpt_s: float | None = None  # the last full checkpoint's measured write time
    _weights_ckpt: dict[str, Any] | None = None  # the last full checkpoint: path, step, weights_sha256
    stop_state: dict[str, Any] | None = None  # what the stop wrote: kind, path, weights_step
    keeps_version: bool = False  # the snapshot θ_v is kept (`TrainerCore.__init__`)
    _version_restored: bool = False

    def set_stop_deadline(self, deadline: float | None, weight_bytes: int = 0) -> None:
        if deadline is not None:
            self._stop_deadline, self._stop_weight_bytes = deadline, int(weight_bytes)

    def _restore_weights(self, resume: dict[str, Any]) -> None:
        """Load the checkpoint's trainer state (a light checkpoint without one keeps the model's weights)."""
        st = resume["state"]
        if resume.get("trainer_dir"):
            self.backend.load(resume["trainer_dir"])
            if st.get("version_weights") and st.get("stop_state") != "light":  # θ_v, written between two syncs
                self._version_restored = self.backend.load_version(resume["trainer_dir"])
            path = os.path.dirname(os.path.abspath(resume["trainer_dir"]))
            self._weights_ckpt = {"path": path, "step": st.get("weights_step", st.get("step")),
                                  "weights_sha256": st.get("weights_sha256")}

    def weights_sha256(self) -> str:
        """The hash of the trainer's current parameters (every rank takes part in the export)."""
        return hash_buckets(self.backend.export_weights(HASH_BUCKET_BYTES))

    def report_weights_hash(self) -> str | None:
        """At the end of the run: the final weights' hash as an event; returned for `fit()`'s result. Under a
        stop deadline, the stop checkpoint's hash (no second export)."""
        if self._stop_deadline is not None:
            return (self.stop_state or {}).get("weights_sha256")
        digest = self.weights_sha256()
        self.controller.record_event(self._ev(
            "info", "weights", f"final weights sha256 {digest} (step {self.local_step}, version {self.version})",
            weights_sha256=digest))
        return digest

    def save_checkpoint(self, reason: str, snapshot: dict | None = None, light: bool = False) -> str:
        """Write a checkpoint now (between steps). `snapshot` is a rollout-side cut taken at this step's sync;
        without one the rollouter is paused briefly to take it. `light`: this step's stream, queue and in-flight
        state with the trainer state of the last full checkpoint (or the initial weights)."""
        from engine.persist.checkpoint import ledger_position, write_checkpoint

        t_start = time.monotonic()
        if snapshot is None:
            snapshot = self.rollouter.snapshot(True)
        weights = self._weights_ckpt if light else None
        ckpt = self.spec.checkpoint  # `engine.plan.role_parts.CheckpointSpec`
        state = {
            **self.loop.state(), "reason": reason,
            "time": time.time(), "run_dir": os.path.abspath(self.run_dir),
            "fingerprint": ckpt.fingerprint,
            **ledger_position(self.ledger.path),
            "trainer": {"stale_processed": self.stale_processed, "dropped_stale": self.dropped_stale,
                        "skipped_updates": self.skipped_updates, "elapsed_s": time.time() - self.t0},
            "rollout": snapshot["rollout"],
        }
        if light:
            state.update(stop_state="light", weights_step=weights["step"] if weights else None,
                         weights_sha256=weights["weights_sha256"] if weights else None)
        else:
            state["weights_sha256"] = self.weights_sha256()
            state["version_weights"] = self.keeps_version and self.loop.since_sync > 0
        queued = [g.to_json() for g in self.loop.current + self.loop.buffer] + snapshot["queued"]
        path = write_checkpoint(ckpt.root(self.run_dir), self.local_step,
                                save_trainer=None if light else (lambda p: self._save_trainer(str(p), state)),
                                state=state,
                                queued=queued, in_flight=snapshot["in_flight"], keep_last=ckpt.keep_last,
                                weights_from=weights["path"] if weights else None)
        self._last_ckpt_step = self.local_step
        if light:
            where = f"the weights of step {weights['step']}" if weights else "the model's initial weights"
            what = f"light stop state ({where}; the stream position, queue and in-flight prompts of this step)"
        else:
            self._full_ckpt_s = time.monotonic() - t_start
            self._weights_ckpt = {"path": str(path), "step": self.local_step,
                                  "weights_sha256": state["weights_sha256"]}
            what = "checkpoint"
        self.stop_state = {"kind": "light" if light else "full", "path": str(path), "reason": reason,
                           "weights_step": weights["step"] if light and weights else
                           (None if light else self.local_step), "weights_sha256": state["weights_sha256"]}
        self.controller.record_event(self._ev(
            "info", "checkpoint", f"{what} saved ({reason}): {path}", path=str(path), reason=reason,
            queued=len(queued), in_flight=len(snapshot["in_flight"]), weights_sha256=state["weights_sha256"],
            light=light))
        return str(path)

    def _save_trainer(self, path: str, state: dict[str, Any]) -> None:
        """The backend's save, and between two syncs the version's weights θ_v beside it (`save_version`)."""
        self.backend.save(path)
        if state.get("version_weights"):
            self.backend.save_version(path)

    def periodic_checkpoint(self, snapshot: dict | None) -> None:
        """A periodic save. One that fails for lack of space (`NoSpaceForCheckpoint`: its partial directory is
        already removed) is an `error` event naming the checkpoint kept, and the run goes on."""
        from engine.persist.checkpoint import NoSpaceForCheckpoint

        try:
            self.save_checkpoint("periodic", snapshot)
        except NoSpaceForCheckpoint as e:
            kept = (self._weights_ckpt or {}).get("path") or "none yet"
            self.controller.record_event(self._ev(
                "error", "checkpoint", f"periodic checkpoint failed: {e}; the previous checkpoint ({kept}) is kept "
                "and the run goes on", reason="periodic", no_space=True, kept=kept))

    def _stop_is_light(self) -> bool:
        """Under a stop deadline: does the full checkpoint not fit in the time left (`stop_grace`)?"""
        from engine.persist.stop_grace import choose_stop_state, full_checkpoint_s

        expected = full_checkpoint_s(self._full_ckpt_s, self._stop_weight_bytes)
        return choose_stop_state(time.time(), self._stop_deadline, expected) == "light"

    def _checkpoint_best_effort(self, reason: str) -> None:
        """A stop/final/on-demand/failure checkpoint; a failure is an event (the last one stays) — and for the
        final one also the run's failure (raised): a run must not end "finished" without its last state."""
        try:
            self.save_checkpoint(reason, light=reason == "stop" and self._stop_is_light())
        except Exception as e:  # noqa: BLE001 - reported, and the previous checkpoint remains usable
            self.controller.record_event(self._ev(
                "error", "checkpoint", f"{reason} checkpoint failed: {type(e).__name__}: {e}"))
            if reason == "final":
                raise RuntimeError(f"the final checkpoint failed: {type(e).__name__}: {e}") from e
