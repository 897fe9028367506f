"""Study 3 — weight sync: trainer → rollout replica through the engine's real path, per transport and dtype,
against a plain memcpy of the same bytes (the physical limit of this machine), for Qwen2-shaped models of
~100M / 500M / 1B parameters.

The path is the engine's (`engine.sync.runtime.publish` → `RolloutReplica.update_weights`):
`TorchTrainerBackend.export_weights` (HF-named tensors in the model's dtype) → flat buckets of
`weight_sync_bucket_mb`, packed and fingerprinted one bucket ahead of the transport → the transport →
the replica receives bucket k+1 while it loads bucket k into its `hf` sampler, and returns its receipt,
checked against the sender's fingerprints (the delivery check). Generation runs on the replica meanwhile, as
in the engine: `object_store` puts every bucket while it generates, then aborts and loads; `collective`
aborts first (the replicas join the broadcast once paused), then the trainer broadcasts while they load.

With back buffers (`rollout.weight_sync_back_buffer`, on when memory allows: `staged` in the rows) the
replica receives the whole version while it keeps generating (`stage_weights`), then it is aborted, drains
its current decode step, and swaps the new weights in (`swap_weights`), as the rollouter does:

    sync_s   = push (export + pack: object store `ray.put`s) + update (the bytes moved into the live weights)
    update_s = staged: transfer into the back buffer + swap;  in place: drained abort → loaded (RPC, load)
    GB/s     = bytes ÷ sync_s                      (bytes = everything sent, tied lm_head included)
    drain_s  = abort → the replica's running decode step ended (it still generates meanwhile)
    pause_s  = staged: drained → swapped (generation stopped);  in place: abort → drained → loaded
    wall_s   = the trainer's whole wait: the sync plus, staged, the drain between transfer and swap
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, finish_result, new_result, table, write_json
from benchmarks.engine_runs import load_config, ray_session
from benchmarks.metrics import gb_per_s, median
from benchmarks.plots import pyplot, save
from benchmarks.targets import evaluate
from engine.plan.run_plan import resolve_plan

STUDY = "weight-sync"
SHAPES: dict[str, dict[str, int]] = {
    "1M": {
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "10M": {
        "vocab_size": 8192,
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "100M": {
        "vocab_size": 32000,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    },
    "500M": {
        "vocab_size": 32000,
        "hidden_size": 1536,
        "intermediate_size": 4096,
        "num_hidden_layers": 18,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    },
}
SHAPES["1B"] = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 18,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
}
TRANSPORTS = ("shared_memory", "collective", "object_store")
SIZES: dict[str, dict[str, Any]] = {
    # (model, dtype): 1B in fp32 is 4.4 GB per copy — the trainer's model, the replica's and its back buffer, the
    # object store's — so it runs alone, through shared memory only (`1B-fp32-shm`), on this shared 24 GiB machine
    "full": {"runs": [("100M", "fp32"), ("100M", "bf16"), ("500M", "fp32"), ("500M", "bf16"), ("1B", "bf16")],
             "transports": TRANSPORTS, "repeats": 3},
    "target": {"runs": [("500M", "bf16")], "transports": TRANSPORTS, "repeats": 3},
    "target-shm": {"runs": [("500M", "bf16")], "transports": ("shared_memory",), "repeats": 3},
    # the same with the replica idle during the sync: the transfer's own cost, without the decode's contention
    "target-shm-idle": {"runs": [("500M", "bf16")], "transports": ("shared_memory",), "repeats": 3,
                        "background_rows": 0},
    "1B-fp32-shm": {"runs": [("1B", "fp32")], "transports": ("shared_memory",), "repeats": 3},
    "toy": {"runs": [("1M", "fp32")], "transports": ("shared_memory", "collective"), "repeats": 1},
}
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
BACKGROUND_ROWS = 4
BACKGROUND_TOKENS = 1024


def build_model_dir(shape: str, root: Path, dtype: str = "fp32") -> tuple[Any, Path]:
    """A randomly initialised Qwen2 of `shape` in `dtype` saved as an HF directory (with the tiny tokenizer,
    whose ids are all inside the vocabulary), and the in-memory model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.models.loader import resolve_model_path

    dims = SHAPES[shape]
    config = Qwen2Config(
        **dims,
        head_dim=dims["hidden_size"] // dims["num_attention_heads"],
        max_position_embeddings=2 * BACKGROUND_TOKENS,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, DTYPES[dtype])).eval()
    out = root / f"qwen2-{shape}-{dtype}"
    model.save_pretrained(out, safe_serialization=True)
    tiny = resolve_model_path("builtin:tiny-qwen")
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return model, out


def memcpy_gb_s(nbytes: int, repeats: int = 3, fresh: bool = True) -> dict[str, float]:
    """Best-of-`repeats` bandwidth of copying `nbytes` between two resident buffers: numpy `copyto`
    (one thread, libc memcpy) and torch `copy_` (all intra-op threads); and, for reference, `fresh`: a copy
    into a newly allocated buffer (first-touch page faults included, as every sync's new buckets pay)."""
    import numpy as np
    import torch

    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best_np = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
    best_torch = min(_timed(lambda: tdst.copy_(tsrc)) for _ in range(repeats))
    out = {"numpy_gb_s": gb_per_s(src.nbytes, best_np), "torch_gb_s": gb_per_s(src.nbytes, best_torch)}
    if fresh:
        best_fresh = min(_timed(lambda: np.copyto(np.empty_like(src), src)) for _ in range(repeats))
        out["fresh_gb_s"] = gb_per_s(src.nbytes, best_fresh)
    return out


MEMCPY_READS = 5
"""`memcpy_gb_s` reads taken before a row's syncs and as many after; the row's yardstick is their median."""


def memcpy_reads(nbytes: int, reads: int = MEMCPY_READS) -> list[float]:
    """`reads` readings of this machine's memcpy bandwidth for `nbytes` (each: the faster of numpy and torch,
    best of 3, `memcpy_gb_s`), taken one after the other."""
    out = []
    for _ in range(reads):
        r = memcpy_gb_s(nbytes, fresh=False)
        out.append(max(r["numpy_gb_s"], r["torch_gb_s"]))
    return out


def copy_kernel() -> str:
    """What does the host copies + fingerprints in this process (`engine.sync.native.describe`): `native avx512`
    (the kernel's ISA; not its cached file, whose path is one machine's) or `numpy (why)`."""
    import engine.sync.native as native

    desc = native.describe()
    return desc.split(" (", 1)[0] if desc.startswith("native ") else desc


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class TimedIter:
    """Wraps an iterator and accumulates the seconds spent producing its items (the trainer's export)."""

    def __init__(self, it: Any) -> None:
        self.it, self.seconds = iter(it), 0.0

    def __iter__(self) -> TimedIter:
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            return next(self.it)
        finally:
            self.seconds += time.perf_counter() - t0


def one_sync(trainer: Any, replica: Any, sync: Any, version: int, bucket_bytes: int,
             rows: int = BACKGROUND_ROWS) -> dict[str, float]:
    """One sync through the engine's pipeline while the replica generates (module docstring)."""
    import ray

    from engine.rollout.base import SamplingParams
    from engine.sync.collective import CollectiveSync
    from engine.sync.flat import copy_stats
    from engine.sync.runtime import publish
    from engine.sync.verify import DeliveryCheck
    from engine.types import GenRequest

    reqs = [
        GenRequest(f"bg{i}", [3, 4, 5 + i], max_new_tokens=BACKGROUND_TOKENS) for i in range(rows)
    ]
    staged = ray.get(replica.stages_weights.remote())  # rollout.weight_sync_back_buffer (auto: memory allows)
    gen_ref = replica.generate.remote(reqs, SamplingParams(temperature=1.0, seed=version))
    time.sleep(0.5)
    export = TimedIter(trainer.export_weights(bucket_bytes))
    c0 = copy_stats()  # the trainer's pack runs in this process: its host copy + fingerprint time
    t0 = time.monotonic()
    if staged:  # as the rollouter: receive into the back buffer while generating, then pause and swap
        if isinstance(sync, CollectiveSync):
            sent = publish(sync, version, export, lambda refs: replica.stage_weights.remote(refs, version))
            t1 = time.monotonic()
        else:
            sent = publish(sync, version, export, lambda refs: refs)
            t1 = time.monotonic()
            sent.out = replica.stage_weights.remote(sent.out, version)
        stage_receipt = ray.get(sent.out)
        t_staged = time.monotonic()
        c1 = copy_stats()
        running = not ray.wait([gen_ref], timeout=0)[0]  # generation ran through the whole transfer
        replica.abort.remote()
        ray.get(gen_ref)
        t2 = time.monotonic()
        receipt = ray.get(replica.swap_weights.remote(version))
        t3 = time.monotonic()
        push_s, update_s = t1 - t0, (t_staged - t1) + (t3 - t2)
        drain_s, pause_s = t2 - t_staged, t3 - t2
        ring = getattr(sync, "ring", None)
        timeline = {"study": {"t0": t0, "published": t1, "staged": t_staged, "drained": t2, "swapped": t3},
                    "sender": list(getattr(ring, "marks", [])), **stage_receipt.get("timeline", {}),
                    "swap": receipt.get("swap_marks", [])}
    else:
        if isinstance(sync, CollectiveSync):  # the engine pauses first: the replicas join once generation stopped
            running = not ray.wait([gen_ref], timeout=0)[0]
            replica.abort.remote()
            ray.get(gen_ref)
            t1 = t2 = time.monotonic()
            paused = t0
            sent = publish(sync, version, export, lambda refs: replica.update_weights.remote(refs, version))
        else:  # the object store is filled while the replica generates, then it pauses and loads
            sent = publish(sync, version, export, lambda refs: refs)
            t1 = time.monotonic()
            running = not ray.wait([gen_ref], timeout=0)[0]
            replica.abort.remote()
            ray.get(gen_ref)
            t2 = time.monotonic()
            paused = t1
            sent.out = replica.update_weights.remote(sent.out, version)
        receipt = ray.get(sent.out)
        t3 = time.monotonic()
        c1 = copy_stats()
        push_s, update_s = t1 - t0, t3 - t2
        drain_s, pause_s = t2 - paused, t3 - paused
        timeline = {}
    report = DeliveryCheck().check(version, sent.fingerprints, {0: receipt}, sent.names)  # raises on a bad one
    if ray.get(replica.version.remote()) != version:
        raise RuntimeError("the replica did not take the new version")
    return {
        "bytes": sent.nbytes,
        "buckets": len(sent.fingerprints),
        "staged": staged,
        "export_s": export.seconds,
        "put_s": max(0.0, push_s - export.seconds),
        "update_s": update_s,
        "replica_load_s": receipt["seconds"],
        "swap_s": receipt.get("swap_s", 0.0),
        # each side's host copy + fingerprint busy time inside the sync (the trainer's pack; the replica's load)
        "pack_copy_s": c1[0] - c0[0],
        "pack_copy_bytes": c1[1] - c0[1],
        "load_copy_s": receipt.get("copy_s", 0.0),
        "load_copy_bytes": receipt.get("copy_bytes", 0),
        "sync_s": push_s + update_s,
        "drain_s": drain_s,
        "pause_s": pause_s,
        "wall_s": t3 - t0,
        "generation_running": running,
        "verified": report.verified == 1.0,  # the replica loaded every bucket exactly, with effect
        "timeline": timeline,
        "breakdown": breakdown(timeline),
    }


def breakdown(timeline: dict[str, Any]) -> dict[str, float]:
    """Where one staged shared-memory sync's time went, from its timeline (`one_sync`: the study's, the sender's
    and the receiver's `time.monotonic()` marks, one clock on this host). The receiver's path from the study's
    start to the swap is cut into consecutive segments whose sum is `sync_s`:

        first_piece_s    start → piece 0's header seen (export, the first pack, its header; or the Ray call
                         that starts the stage, when that came later: `ray_start_s`)
        load_s           Σ header seen → loaded (the replica's copy + fingerprint of each piece)
        ack_s            Σ loaded → acknowledged (the receiver's acknowledgement)
        sender_behind_s  Σ acknowledged k → piece k+1 published, where the sender published later (a pipeline
                         bubble: the trainer's pack was the slower side)
        control_s        Σ the rest of each wait for the next header (published → seen: the control path)
        end_s            end marker seen → the stage's Ray call returned to the trainer
        swap_s           the pause (`swap_weights` call: Ray, the swap, the weight sample, the return)

    plus, not on that path: `ray_start_s` (start → the stage running), `slot_wait_s` (Σ the sender waiting for a
    slot's acknowledgements), `pack_s` (Σ the sender's packs), `weights_sample_s` (inside `swap_s`). Empty when
    the timeline is incomplete (not a staged shared-memory sync)."""
    study, sender, pull = timeline.get("study"), timeline.get("sender") or [], timeline.get("pull") or []
    stage, swap = timeline.get("stage") or [], timeline.get("swap") or []
    if not study or not sender or not pull or len(stage) != 2:
        return {}
    snd: dict[tuple[str, int], float] = {(e, k): t for e, k, t in sender}
    rcv: dict[tuple[str, int], float] = {(e, k): t for e, k, t in pull}
    n = sum(1 for e, _, _ in pull if e == "loaded")
    t0 = study["t0"]
    out = {"pieces": float(n), "ray_start_s": stage[0] - t0, "first_piece_s": rcv[("header", 0)] - t0,
           "load_s": 0.0, "ack_s": 0.0, "sender_behind_s": 0.0, "control_s": 0.0}
    for k in range(n):
        out["load_s"] += rcv[("loaded", k)] - rcv[("header", k)]
        out["ack_s"] += rcv[("acked", k)] - rcv[("loaded", k)]
        gap = rcv[("header", k + 1)] - rcv[("acked", k)]
        published = snd.get(("published", k + 1), snd.get(("ended", n), rcv[("acked", k)]))
        behind = min(gap, max(0.0, published - rcv[("acked", k)]))
        out["sender_behind_s"] += behind
        out["control_s"] += gap - behind
    out["end_s"] = study["staged"] - rcv[("header", n)]
    out["swap_s"] = study["swapped"] - study["drained"]
    if len(swap) == 3:
        out["weights_sample_s"] = swap[2] - swap[1]
    out["slot_wait_s"] = sum(snd.get(("slot", k), 0.0) - snd.get(("get", k), 0.0) for k in range(n))
    out["pack_s"] = sum(snd.get(("packed", k), 0.0) - snd.get(("slot", k), 0.0) for k in range(n))
    out["sum_s"] = sum(out[k] for k in ("first_piece_s", "load_s", "ack_s", "sender_behind_s", "control_s",
                                        "end_s", "swap_s"))
    return out


def measure_shape(shape: str, dtype: str, transports: Any, repeats: int, root: Path,
                  threads: int, background: int = BACKGROUND_ROWS) -> list[dict[str, Any]]:
    import os

    import ray

    from engine.runtime.actors import RolloutReplica
    from engine.sync.collective import CollectiveSync
    from engine.sync.object_store import ObjectStoreSync
    from engine.sync.runtime import SHM_SLOT_BYTES
    from engine.sync.shared_memory import SharedMemorySync
    from engine.trainer.fsdp import free_port
    from engine.trainer.torch_trainer import TorchTrainerBackend

    model, model_dir = build_model_dir(shape, root, dtype)
    params = sum(p.numel() for p in model.parameters())
    sent_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())  # tied lm_head included
    # the run config only shapes the replica: no optimizer step is taken, so the plan's trainer memory check
    # (Adam states of a 1B model exceed the cpu preset's 16 GB per worker) must not refuse it
    hardware = root / "cpu-bench.toml"
    hardware.write_text((PRESETS.parent / "hardware" / "cpu.toml").read_text().replace("memory_gb = 16",
                                                                                       "memory_gb = 64"))
    cfg = load_config(PRESETS / "tiny-cpu.toml", [f'model.path="{model_dir}"', "trainer.test_freq=0",
                                                  f'model.dtype="{DTYPES[dtype]}"',
                                                  f'resources.hardware="{hardware}"'])
    bucket_bytes = cfg.rollout.weight_sync_bucket_mb * 2**20
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-6})
    rows = []
    for transport in transports:
        spec = dataclasses.replace(resolve_plan(cfg).role_specs().replica, model_dir=str(model_dir), threads=threads)
        replica = RolloutReplica.options(num_cpus=1).remote(spec, 0)
        host = ray.util.get_node_ip_address()
        sync = {"collective": lambda: CollectiveSync(host, free_port(), 2),
                "shared_memory": lambda: SharedMemorySync(host, free_port(), 2, run_id=f"bench{os.getpid()}",
                                                          slot_bytes=min(SHM_SLOT_BYTES, bucket_bytes)),
                "object_store": ObjectStoreSync}[transport]()
        before = memcpy_reads(sent_bytes)  # the yardstick, read before and after the syncs (their median counts)
        try:
            ray.get(replica.ready.remote())
            runs = [one_sync(trainer, replica, sync, v, bucket_bytes, background) for v in range(1, repeats + 2)][1:]
        finally:  # the first sync (group formation, first-touch pages) is a warm-up
            ray.kill(replica, no_restart=True)
            getattr(sync, "close", lambda: None)()
        after = memcpy_reads(sent_bytes)
        rows.append(_row(shape, dtype, transport, params, cfg.rollout.weight_sync_bucket_mb, runs, before + after))
    del trainer, model
    gc.collect()
    shutil.rmtree(model_dir, ignore_errors=True)
    return rows


def _row(shape: str, dtype: str, transport: str, params: int, bucket_mb: int,
         runs: list[dict[str, Any]], reads: list[float] | None = None) -> dict[str, Any]:
    nbytes = runs[0]["bytes"]
    copy = memcpy_gb_s(nbytes)
    med = {
        k: median([r[k] for r in runs])
        for k in ("export_s", "put_s", "update_s", "replica_load_s", "swap_s", "sync_s", "drain_s", "pause_s",
                  "wall_s", "pack_copy_s", "load_copy_s")
    }
    sync_gb_s = gb_per_s(nbytes, med["sync_s"])
    reads = list(reads or []) + [max(copy["numpy_gb_s"], copy["torch_gb_s"])]  # + this moment's read
    memcpy = median(reads)
    parts = [r["breakdown"] for r in runs if r.get("breakdown")]
    import datetime
    import os

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load": list(os.getloadavg()),
        "model": shape,
        "dtype": dtype,
        "transport": transport,
        "params": params,
        "bytes": nbytes,
        "buckets": runs[0]["buckets"],
        "bucket_mb": bucket_mb,
        **med,
        "sync_gb_s": sync_gb_s,
        **copy,
        "memcpy_gb_s": memcpy,  # the median of `memcpy_reads` (before the syncs, after them, and at the row)
        "memcpy_reads_gb_s": reads,
        "fraction_of_memcpy": sync_gb_s / memcpy,
        # the per-piece timeline's breakdown, median of the runs (`breakdown`; each run keeps its timeline)
        "breakdown": {k: median([p[k] for p in parts]) for k in parts[0]} if parts else {},
        "pause_over_sync": med["pause_s"] / med["sync_s"],
        # each side's host copy + fingerprint rate inside the sync (0: the side did not copy on the host)
        "pack_copy_gb_s": gb_per_s(runs[0]["pack_copy_bytes"], med["pack_copy_s"]) if med["pack_copy_s"] else 0.0,
        "load_copy_gb_s": gb_per_s(runs[0]["load_copy_bytes"], med["load_copy_s"]) if med["load_copy_s"] else 0.0,
        "copy_kernel": copy_kernel(),
        "verified": all(r["verified"] for r in runs),
        "staged": all(r["staged"] for r in runs),
        "generation_running": all(r["generation_running"] for r in runs),
        "runs": runs,
    }


def run(size: str, out_dir: Path) -> dict[str, Any]:
    import os

    started = time.monotonic()
    spec = SIZES[size]
    threads = 1
    result = new_result(
        STUDY,
        size,
        {
            **spec,
            "replica_threads": threads,
            "trainer_threads": os.cpu_count(),
            "background_rows": spec.get("background_rows", BACKGROUND_ROWS),
            "shapes": {m: SHAPES[m] for m, _ in spec["runs"]},
        },
    )
    largest = max((4 if d == "fp32" else 2) * _param_count(SHAPES[m]) for m, d in spec["runs"])
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="asyncrl-bench-sync-") as tmp,
        ray_session(max(1 << 30, 2 * largest)),
    ):
        for shape, dtype in spec["runs"]:
            rows += measure_shape(shape, dtype, spec["transports"], spec["repeats"], Path(tmp), threads,
                                  spec.get("background_rows", BACKGROUND_ROWS))
    result["rows"] = rows
    result["tables"] = [
        table(
            f"Trainer → replica weight sync (median of {spec['repeats']})",
            [
                "model",
                "dtype",
                "transport",
                "params",
                "MB sent",
                "export (s)",
                "put (s)",
                "replica update (s)",
                "sync (s)",
                "sync GB/s",
                "memcpy GB/s",
                "memcpy to a new buffer GB/s",
                "sync ÷ memcpy",
                "drain (s)",
                "pause (s)",
                "pause ÷ sync",
                "trainer wait (s)",
                "staged",
                "load",
            ],
            [
                [
                    r["model"],
                    r["dtype"],
                    r["transport"],
                    f"{r['params'] / 1e6:.1f}M",
                    round(r["bytes"] / 1e6, 1),
                    round(r["export_s"], 3),
                    round(r["put_s"], 3),
                    round(r["update_s"], 3),
                    round(r["sync_s"], 3),
                    round(r["sync_gb_s"], 2),
                    round(r["memcpy_gb_s"], 2),
                    round(r["fresh_gb_s"], 2),
                    f"{100 * r['fraction_of_memcpy']:.0f} %",
                    round(r["drain_s"], 3),
                    round(r["pause_s"], 3),
                    round(r["pause_over_sync"], 2),
                    round(r["wall_s"], 3),
                    "yes" if r["staged"] else "no",
                    f"{r['load'][0]:.1f}",
                ]
                for r in rows
            ],
        )
    ]
    at = next((r for r in rows if (r["model"], r["dtype"], r["transport"]) == ("500M", "bf16", "shared_memory")),
              rows[0])
    what = f"{at['model']} {at['dtype']} {at['transport']}"
    result["targets"] = [
        evaluate(f"sync ÷ memcpy bandwidth ({what})", round(at["fraction_of_memcpy"], 3), 0.5, ">="),
        evaluate(f"generation pause ÷ transfer time ({what})", round(at["pause_over_sync"], 3), 1.2, "<="),
    ]
    result["notes"] = [
        "Bytes include the tied `lm_head.weight`, which the engine sends explicitly (vLLM needs it).",
        (
            "Both transports move flat buckets in the model's dtype: the sender packs each bucket into one buffer "
            "(copy 1) while the previous one travels; object store: `ray.put` copies it into shared memory "
            "(copy 2) and the replica loads from a zero-copy view (copy 3); collective: gloo streams it over "
            "loopback TCP into the replica's receive buffer (copies 2–3: socket buffers) and the replica loads "
            "it (copy 4). With the two sides overlapped the time is set by the slowest stage, not their sum."
        ),
        (
            "memcpy = the median of 11 reads of the same bytes (5 before the row's syncs, 5 after, 1 at the row; "
            "all kept in `memcpy_reads_gb_s`), each the faster of numpy `copyto` (one thread) and torch `copy_` "
            "(all threads) between two resident buffers, best of 3: one read moved by 7.4–10.1 GB/s within "
            "minutes, so no single one decides the ratio; 'memcpy to a new buffer' allocates the destination "
            "first, so it pays the first-touch page faults that each sync's fresh buckets pay."
        ),
        (
            f"Generation: {spec.get('background_rows', BACKGROUND_ROWS)} rows decode on the replica through every sync. Staged (back buffer): "
            "the replica receives the version while they decode, then is aborted; `drain` = until its running "
            "decode step ended (it still produces tokens), `pause` = from then until the swap made the new "
            "weights live. In place: `pause` counts from the abort to the weights loaded (drain included). "
            "`trainer wait` = the whole sync as the trainer waits for it (staged: sync + drain)."
        ),
        (
            "Rows also record each side's host copy + fingerprint busy time inside the sync (`pack_copy_s`: the "
            "trainer packing its tensors into the buffers; `load_copy_s`: the replica copying them out; "
            f"`pack_copy_gb_s` / `load_copy_gb_s` their rates) and what did them (`copy_kernel`: {copy_kernel()})."
        ),
    ]
    write_json(finish_result(result, started), out_dir)
    plot(rows, out_dir)
    return result


def _param_count(dims: dict[str, int]) -> int:
    h, v, i, layers = (
        dims["hidden_size"],
        dims["vocab_size"],
        dims["intermediate_size"],
        dims["num_hidden_layers"],
    )
    kv = dims["num_key_value_heads"] * h // dims["num_attention_heads"]
    return v * h * 2 + layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h + h + 2 * kv)


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    labels = [r["model"] for r in rows]
    xs = range(len(rows))
    width = 0.38
    left.bar(
        [x - width / 2 for x in xs], [r["sync_gb_s"] for r in rows], width, label="trainer → replica sync"
    )
    left.bar(
        [x + width / 2 for x in xs], [r["memcpy_gb_s"] for r in rows], width, label="memcpy (same bytes)"
    )
    left.set_xticks(list(xs), labels)
    left.set(ylabel="GB/s", title="weight sync bandwidth vs memcpy")
    left.legend(fontsize=8)
    parts = ("export_s", "put_s", "update_s")
    bottom = [0.0] * len(rows)
    for part in parts:
        vals = [r[part] for r in rows]
        right.bar([x - width / 2 for x in xs], vals, width, bottom=bottom, label=part.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    right.bar(
        [x + width / 2 for x in xs],
        [r["pause_s"] for r in rows],
        width,
        color="tab:red",
        label="generation pause",
    )
    right.set_xticks(list(xs), labels)
    right.set(yscale="log", ylabel="seconds", title="sync time breakdown and generation pause")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.title.set_fontsize(10)
    return save(fig, out_dir, STUDY)
