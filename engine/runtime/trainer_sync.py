"""The trainer's weight-sync methods (a part of `engine.runtime.trainer_actor.TrainerCore`): the per-sync push
(`_sync`: export → transport → the delivery check → the snapshot θ_v → metrics and the `sync` event), the
resume's push of the version's weights (`push_version`), the catch-up broadcast to
replaced replicas of a collective transport (`_catch_up`), and the wait for them before training on
(`_await_replacements`)."""

from __future__ import annotations

import time
from typing import Any

from engine.loop.commands import Sync
from engine.runtime.sync_report import sync_event, sync_metrics
from engine.sync.collective import CollectiveSync
from engine.sync.object_store import ObjectStoreSync
from engine.sync.runtime import publish
from engine.sync.verify import DeliveryReport

REPLACEMENT_WAIT_S = 600.0
"""The longest the trainer waits, before its first step after a sync, for replacement replicas to start and be
caught up (a replica's start on a loaded host takes minutes at worst)."""


class TrainerSync:
    """Sync methods of `TrainerCore` (uses its loop, backend, weight_sync, rollouter, controller and delivery)."""

    _stop_reason: str | None = None
    keeps_version: bool = False  # the snapshot θ_v is kept (`TrainerCore.__init__`)
    _catch_ups: int = 0  # catch-up broadcasts so far (their group generations are −1, −2, …)

    def _sync(self, c: Sync) -> dict[str, float]:
        """Push the weights of `c.version` (bucketed, by `rollout.weight_sync`'s transport) to every replica."""
        t0, version, gen, members = time.monotonic(), c.version, 0, None
        if isinstance(self.weight_sync, CollectiveSync):  # the group: generation and slots (engine.sync.collective)
            gen, members = self.rollouter.sync_generation()
        sent = publish(self.weight_sync, version, self.backend.export_weights(self.bucket_bytes),
                       lambda refs: self.rollouter.update_weights(version, refs, self.local_step, c.cut, c.held),
                       gen=gen, corrupt_bucket=self.spec.weight_sync.corrupt_bucket, members=members,
                       quantization=self.spec.weight_sync.quantization)
        export_s = time.monotonic() - t0
        out = sent.out.result()
        report = self._verify_delivery(version, sent, out.pop("receipts"))
        self._sync_snapshot = out.pop("snapshot", None)
        if self.keeps_version:  # θ_v: π_prox (decoupled mode), what a resume between syncs serves
            t_snap = time.monotonic()
            self.backend.snapshot_params()
            out["asyncrl/prox_snapshot_s"] = time.monotonic() - t_snap
        out.update(sync_metrics(time.monotonic() - t0, sent.nbytes, export_s, report, len(sent.fingerprints)))
        msg, fields = sync_event(version, out, report, self.loop.next_trigger, type(self.weight_sync).__name__)
        self.controller.record_event(self._ev("info", "sync", msg, **fields))
        return out

    def push_version(self) -> None:
        """Resume: give the replicas the weights of the current version v before generation starts — the
        snapshot θ_v where one is kept (from the checkpoint when it was taken between two syncs: the trainer's
        own weights are `since_sync` steps past θ_v then), swapped in and out bit-exactly; else the trainer's
        current weights (the resume line says so)."""
        version, swap = self.version, self.keeps_version
        if swap:
            self.backend.snapshot_swap(True)
        try:
            sent = publish(ObjectStoreSync(put=self.peers.put), version,
                           self.backend.export_weights(self.bucket_bytes), lambda refs: self.rollouter.load_weights(version, refs),
                           quantization=self.spec.weight_sync.quantization)
        finally:
            if swap:
                self.backend.snapshot_swap(False)
        self._verify_delivery(version, sent, sent.out.result())

    def _catch_up(self) -> bool:
        """Collective sync: a replaced replica waits for the weights of the last sync. While this trainer still
        holds exactly them (no step since), broadcast them to the waiting replicas alone (a catch-up group);
        otherwise the replica receives the next sync. True when it broadcast."""
        if not isinstance(self.weight_sync, CollectiveSync) or self.version == 0 or self.loop.since_sync:
            return False
        slots = self.rollouter.catch_up_slots()
        if not slots:
            return False
        self._catch_ups += 1  # catch-up groups: generations −1, −2, …
        version = self.version
        sent = publish(self.weight_sync, version, self.backend.export_weights(self.bucket_bytes),
                       lambda refs: self.rollouter.catch_up(version, refs, slots), gen=-self._catch_ups,
                       members=slots, quantization=self.spec.weight_sync.quantization)
        report = self._verify_delivery(version, sent, sent.out.result())
        self.controller.record_event(self._ev(
            "info", "sync", f"weights v{version} sent to replaced rollout replica(s) {slots}: "
            f"{sent.nbytes / 2**20:.1f} MiB, verified on {report.replicas} of {len(slots)}", bytes=sent.nbytes,
            verified=report.verified, replicas_verified=report.replicas, catch_up=slots))
        return True

    def _await_replacements(self) -> None:
        """Before the first pull after a sync (or a resume), while replacement replicas are starting: wait for
        them and catch them up (`_catch_up`) before training on, for at most `REPLACEMENT_WAIT_S`, or until
        none is starting any more (up and caught up, or the restart budget spent) or a stop is asked for.

        Why: with a collective transport a replacement can only get the weights of the last sync while the
        trainer still holds them, i.e. before its next step. A replica that dies during a sync (or just after)
        while the queue already holds the next step's batch would otherwise be left waiting for the next sync
        — which, at `trigger_parameter_sync_step` ≥ 2, needs batches only the missing replica can generate: a
        deadlock (found by the soak's `receiver-mid-sync` fault). Waiting here changes no decision of the loop
        (the same steps train the same batches), so deterministic runs keep their result."""
        if not isinstance(self.weight_sync, CollectiveSync) or self.version == 0 or self.loop.since_sync:
            return
        deadline = time.monotonic() + REPLACEMENT_WAIT_S
        while self.rollouter.replacements_starting():
            if self._catch_up() or self._stop_reason is not None or time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def _verify_delivery(self, version: int, sent: Any, receipts: dict[int, Any]) -> DeliveryReport:
        """Every live replica loaded exactly the sent buckets, else `SyncDeliveryError` (the run fails, naming
        the replica and the bucket); a replica whose weights did not change is an `error` event (alarm)."""
        report = self.delivery.check(version, sent.fingerprints, receipts, sent.names)
        for alarm in report.alarms:
            self.controller.record_event(self._ev("error", "sync", alarm))

        return report
