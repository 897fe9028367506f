"""Weight-sync transports side by side on CPU: Ray's object store vs the collective gloo broadcast
(`engine.sync.object_store` vs `engine.sync.collective`), trainer process → one replica actor.

Both move the same fp32 buckets (`weight_sync_bucket_mb`) and end with the replica holding a private copy of
every tensor (as `load_buckets_into` leaves it), so `seconds` is push + transfer + the receiver's copy:

    object store: ray.put per bucket (trainer) → replica ray.get (zero-copy view) → copy into its buffer
    collective:   replica joins (handle) ∥ trainer broadcasts header, meta, payload per bucket → copy out

`form_s` is the collective group's one-time formation (first sync only). Run:
`python -m benchmarks.weight_sync_transports [--mb 40 400] [--repeats 3]`; prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import ray

BUCKET_MB = 64


def make_buckets(total_mb: int) -> list[dict[str, np.ndarray]]:
    per = BUCKET_MB * 2**20 // 4
    left, out, i = total_mb * 2**20 // 4, [], 0
    while left > 0:
        n = min(per, left)
        out.append({f"layer{i}.weight": np.random.default_rng(i).standard_normal(n, dtype=np.float32)})
        left -= n
        i += 1
    return out


@ray.remote
class Replica:
    def __init__(self) -> None:
        self.held: dict[str, np.ndarray] = {}

    def _load(self, buckets: Any) -> int:
        n = 0
        for b in buckets:
            for k, v in b.items():
                self.held[k] = np.array(v)  # the receiver's copy into its own memory
                n += v.nbytes
        return n

    def pull_store(self, refs: list) -> int:
        return self._load(ray.get(r) for r in refs)

    def pull_collective(self, handle: Any) -> int:
        from engine.sync.collective import pull

        return self._load(pull(handle, 1))


def measure(total_mb: int, repeats: int) -> dict[str, Any]:
    from engine.sync.collective import CollectiveSync
    from engine.trainer.fsdp import free_port

    buckets = make_buckets(total_mb)
    replica = Replica.remote()
    store_s, coll_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        refs = [ray.put(b) for b in buckets]
        assert ray.get(replica.pull_store.remote(refs)) == total_mb * 2**20
        store_s.append(time.perf_counter() - t0)
        del refs
    sync = CollectiveSync(ray.util.get_node_ip_address(), free_port(), 2)
    t0 = time.perf_counter()
    first = sync.announce(0)
    ref = replica.pull_collective.remote(first)
    sync.send(first, [{"warmup": np.zeros(1, np.float32)}])
    ray.get(ref)
    form_s = time.perf_counter() - t0
    for v in range(repeats):
        t0 = time.perf_counter()
        handle = sync.announce(v + 1)
        ref = replica.pull_collective.remote(handle)
        sync.send(handle, buckets)
        assert ray.get(ref) == total_mb * 2**20
        coll_s.append(time.perf_counter() - t0)
    ray.kill(replica)
    med_store, med_coll = statistics.median(store_s), statistics.median(coll_s)
    return {"mb": total_mb, "object_store_s": round(med_store, 4), "collective_s": round(med_coll, 4),
            "object_store_gb_s": round(total_mb / 1024 / med_store, 3),
            "collective_gb_s": round(total_mb / 1024 / med_coll, 3), "form_s": round(form_s, 3),
            "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, nargs="+", default=[40, 400])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             object_store_memory=max(1 << 30, 3 * max(args.mb) * 2**20))
    try:
        for mb in args.mb:
            print(json.dumps(measure(mb, args.repeats)), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
