"""The delivery check of every weight sync: did each replica load exactly what the trainer sent?

Receiver side (`Delivery`): the buckets a replica consumes pass through a wrapper that records each one's
fingerprint where its bytes already are (the received buffer: a shared-memory slot or Ray's shared memory,
the broadcast buffer for the collective; `engine.sync.flat.fingerprint`) — computed by the load itself while
it copies the bucket out (host buckets, `engine.sync.apply.load_flat`), else by the wrapper once the
consumer is done with the bucket. A vLLM replica's workers receive a broadcast themselves
and return their fingerprints; with the other transports each worker fingerprints the bytes it got in the RPC. A
multi-process replica's receipt carries every worker's own list (`workers`, in vLLM's global rank order — every
node of a replica that spans nodes), how many workers its engine has (`world`) and each one's weight sample
(`worker_weights`). After loading, the replica also fingerprints a sample of its *own* weights
(`weights_fingerprint`: every 4099th byte of each tensor, chained) — cheap, and independent of the transport.

Trainer side (`DeliveryCheck.check`, once per sync):

* every live replica must report one fingerprint per bucket sent, equal to the sender's: a difference, a
  missing bucket or a replica that reported nothing raises `SyncDeliveryError` naming the replica and the
  first bad bucket (its index and first tensor names) — the run fails, never a silent continue; the same for each
  worker of a multi-process replica ("rollout replica 0 worker 1 …"), and fewer worker receipts than `world` fail;
* the always-on alarm: when what was sent changed since the previous sync (the fingerprints differ) but a
  replica's (or one of its workers') weight sample did not, its load did not take effect (verl #7495, SkyRL
  #1680) — returned as messages for an `error` event.

The check's `DeliveryReport` says what it verified: `verified` = (replicas that loaded every bucket exactly and
whose load took effect) / (replicas that reported), 0 when no replica reported — the `asyncrl/sync/verified`
metric and the sync event's `verified` are this number, never a constant.

Pure Python apart from the lazy torch import of the two fingerprint helpers; no Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

SAMPLE_STRIDE = 4099
"""Byte stride of the weight sample (a prime, so it does not alias with tensor row lengths)."""
_MASK = 2**64 - 1


class SyncDeliveryError(RuntimeError):
    """A replica did not load what the trainer sent."""


class Delivery:
    """Wraps the buckets a replica consumes and records each one's fingerprint (`fingerprints`, in order).
    A consumer that receives elsewhere (vLLM workers) sets `fingerprints` itself."""

    def __init__(self, buckets: Iterable[Any], handle: Any = None, rank: int | None = None) -> None:
        self.buckets, self.handle, self.rank = buckets, handle, rank
        self.fingerprints: list[int] = []
        self.workers: list[list[int]] | None = None  # a multi-process replica: each worker's own fingerprints

    def __iter__(self) -> Iterator[Any]:
        from engine.sync.flat import FlatBucket, fingerprint, flatten

        it = iter(self.buckets)
        try:
            for bucket in it:
                fb = bucket if isinstance(bucket, FlatBucket) else flatten(bucket, len(self.fingerprints))
                fb.fingerprint = None  # recomputed on the bytes this replica received: by the consumer's load
                yield fb  # (`engine.sync.apply.load_flat`, fused with its copy), else here once it is done
                if fb.fingerprint is None:
                    fb.fingerprint = fingerprint(fb.data)
                self.fingerprints.append(fb.fingerprint)
        finally:  # a consumer that stopped (an error): the source acknowledges the rest to its sender now
            close = getattr(it, "close", None)
            if close is not None:
                close()


class WeightSamples:
    """The weight sample's per-tensor sums taken *while* a load wrote the tensors (the native host load,
    `engine.sync.apply.load_flat` → `engine.sync.native.copy_fp_batch_sampled`: each tensor's sampled bytes read
    back from the cache right after they were copied), so `weights_fingerprint` need not read ~1 cache line in
    64 of the model from memory again after the swap. `record` an address written whole by a direct copy,
    `touched` a range written any other way during the same load; `valid()` keeps the records no other write of
    that load overlapped. A record describes the bytes at its address: a caller uses it only while nothing else
    has written there (`engine.sync.staging.BackBuffer`: from the stage to the fingerprint right after the swap)."""

    def __init__(self) -> None:
        self.sums: dict[int, tuple[int, int]] = {}
        self.dirty: list[tuple[int, int]] = []

    def record(self, ptr: int, nbytes: int, total: int) -> None:
        if nbytes > 0:
            self.sums[ptr] = (nbytes, int(total))

    def touched(self, t: Any) -> None:
        """A tensor (or view) written by another path than a recorded direct copy."""
        span = t.element_size() * (1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))) \
            if t.numel() else 0
        self.dirty.append((t.data_ptr(), span))

    def valid(self) -> dict[int, tuple[int, int]]:
        """address → (bytes, sampled sum) of every record no `touched` range overlaps."""
        return {p: v for p, v in self.sums.items()
                if not any(p < d + n and d < p + v[0] for d, n in self.dirty)}


def weights_fingerprint(tensors: Iterable[Any], known: dict[int, tuple[int, int]] | None = None) -> int:
    """A sample of the weights' bytes: every `SAMPLE_STRIDE`-th byte of each tensor, summed on its device, the
    sums chained (h ← h·1000003 + s mod 2^64). Touches ~1/64 of the model's cache lines; any trained tensor
    changes it. `known` (`WeightSamples.valid()`): the sums of host tensors a load just wrote whole, by
    address — a contiguous host tensor whose (address, bytes) is there takes that sum instead of reading its
    bytes again (the same value: the load summed the same bytes); every other tensor is read."""
    import numpy as np
    import torch

    h = 0
    with torch.no_grad():
        for t in tensors:
            t = t.detach()
            if t.device.type == "cpu" and t.is_contiguous():  # numpy: the same sum, a fifth of torch's overhead
                n = t.numel() * t.element_size()
                rec = known.get(t.data_ptr()) if known else None
                if rec is not None and rec[0] == n:
                    s = rec[1]
                else:
                    b = t.reshape(-1).view(torch.uint8).numpy()
                    s = int(b[::SAMPLE_STRIDE].sum(dtype=np.int64))
            else:
                b = t.contiguous().view(-1).view(torch.uint8)
                s, n = int(b[::SAMPLE_STRIDE].sum(dtype=torch.int64)), b.numel()
            h = (h * 1000003 + s + n) & _MASK
    return h


def _names(names: list[list[str]] | None, k: int) -> str:
    if not names or k >= len(names) or not names[k]:
        return ""
    shown = ", ".join(names[k][:3]) + (", …" if len(names[k]) > 3 else "")
    return f" ({shown})"


@dataclass
class DeliveryReport:
    """What one sync's check verified (module docstring)."""

    replicas: int
    """Replicas whose receipts were compared bucket by bucket with what was sent (all matched: else it raised)."""
    ineffective: int = 0
    """Of those, replicas whose weights did not change although the sent ones did (each is an alarm)."""
    alarms: list[str] = field(default_factory=list)
    workers: int = 0
    """Receivers compared bucket by bucket: each worker of a multi-process replica (vLLM, every node), else the
    replica itself."""

    @property
    def verified(self) -> float:
        """The fraction of replicas that loaded exactly what was sent, with effect; 0.0 when none reported."""
        return (self.replicas - self.ineffective) / self.replicas if self.replicas else 0.0


class DeliveryCheck:
    """The trainer's per-sync comparison (module docstring); keeps the previous sync's fingerprints."""

    def __init__(self) -> None:
        self.sent_before: list[int] | None = None
        self.weights_before: dict[int, int] = {}

    def check(self, version: int, sent: list[int], receipts: dict[int, dict[str, Any] | None],
              names: list[list[str]] | None = None) -> DeliveryReport:
        """Raise `SyncDeliveryError` on the first replica whose fingerprints differ from `sent`; return the
        report, with the alarm messages of replicas whose weights did not change although `sent` did."""
        compared = 0
        for rid in sorted(receipts):
            receipt = receipts[rid] or {}
            got = receipt.get("fingerprints")
            if got is None:
                raise SyncDeliveryError(f"weight sync v{version}: rollout replica {rid} did not load the weights "
                                        f"(no receipt for any of the {len(sent)} buckets)")
            _compare(version, f"rollout replica {rid}", sent, got, names)
            workers = receipt.get("workers")
            if workers is not None:  # a multi-process replica: every worker's own receipt
                if len(workers) != int(receipt.get("world", len(workers))):
                    raise SyncDeliveryError(f"weight sync v{version}: rollout replica {rid}: {len(workers)} of its "
                                            f"{receipt['world']} workers reported a receipt")
                for w, got_w in enumerate(workers):
                    _compare(version, f"rollout replica {rid} worker {w}", sent, got_w, names)
            compared += len(workers) if workers is not None else 1
        alarms = []
        changed = self.sent_before is not None and self.sent_before != list(sent)
        for rid in sorted(receipts):
            receipt = receipts[rid] or {}
            samples = {(rid, None): receipt.get("weights")}
            samples.update({(rid, w): s for w, s in enumerate(receipt.get("worker_weights") or [])})
            stale = []
            for key, w in samples.items():
                if w is None:
                    continue
                if changed and self.weights_before.get(key) == w:
                    stale.append(key[1])
                self.weights_before[key] = w
            if stale:
                who = "" if stale == [None] else " (worker " + ", ".join(str(k) for k in stale if k is not None) + ")"
                alarms.append(f"weight sync v{version}: rollout replica {rid}'s weights{who} did not change although "
                              "the trainer sent changed weights: its load had no effect")
        self.sent_before = list(sent)
        return DeliveryReport(len(receipts), len(alarms), alarms, compared)


def _compare(version: int, who: str, sent: list[int], got: list[int], names: list[list[str]] | None) -> None:
    """Raise `SyncDeliveryError` unless `got` (one receiver's per-bucket fingerprints) is exactly `sent`."""
    for k, want in enumerate(sent):
        if k >= len(got):
            raise SyncDeliveryError(f"weight sync v{version}: {who} did not load bucket {k}{_names(names, k)}: it "
                                    f"loaded {len(got)} of {len(sent)} buckets")
        if int(got[k]) != int(want):
            raise SyncDeliveryError(f"weight sync v{version}: {who} loaded bucket {k}{_names(names, k)} with checksum "
                                    f"{int(got[k]):#018x}, the trainer sent {int(want):#018x}: the weights were "
                                    "corrupted on the way")
    if len(got) > len(sent):
        raise SyncDeliveryError(f"weight sync v{version}: {who} loaded {len(got)} buckets, the trainer sent "
                                f"{len(sent)}")
