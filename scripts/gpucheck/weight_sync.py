"""Weight sync between two processes sharing one device: a trainer process (rank 0) sends every HF-named
tensor of a model, in buckets of ~`bucket_bytes` (`engine.sync.buckets.bucketize`), to a rollout process
(rank 1) that copies them into its own model of the same architecture.

Transports:
* ``nccl`` / ``gloo`` — a collective: each bucket is packed into one flat byte buffer and
  `torch.distributed.broadcast` from rank 0; rank 1 unpacks it into its parameters. NCCL refuses two ranks
  on the same GPU ("Duplicate GPU detected"), so on a one-GPU machine `probe_nccl` records that refusal.
* ``ipc`` — two flat buffers allocated by rank 0 are shared once (CUDA IPC on a GPU, shared memory on
  CPU) through a `torch.multiprocessing` queue; per bucket rank 0 packs into the free buffer and rank 1
  unpacks and acknowledges (double buffering) — the colocated trainer → rollout path.

Seconds = first pack → last bucket loaded by the receiver; GB/s = payload bytes / seconds (tied
`lm_head.weight` sent too, as the engine's exports do). The receiver starts from other random weights and
checks bit-exactness by an integer checksum: Σ over tensors of Σ bits(t) (bf16 / fp32 read as int16 / int32).
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from engine.sync.apply import named_tensors
from engine.sync.buckets import bucketize

ALIGN = 256
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Entry:
    """Where one tensor sits in a packed bucket."""

    name: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


def plan_buckets(named: dict[str, torch.Tensor], bucket_bytes: int) -> list[list[Entry]]:
    """Bucket the tensors in order and give each its byte offset (aligned to `ALIGN`) in its bucket."""
    plans = []
    for bucket in bucketize(named.items(), bucket_bytes):
        entries, offset = [], 0
        for name, t in bucket.items():
            entries.append(Entry(name, offset, t.numel() * t.element_size(), tuple(t.shape), str(t.dtype)))
            offset += -(-entries[-1].nbytes // ALIGN) * ALIGN
        plans.append(entries)
    return plans


def packed_size(plan: list[Entry]) -> int:
    return max(e.offset + e.nbytes for e in plan)


def _view(buf: torch.Tensor, e: Entry) -> torch.Tensor:
    dtype = getattr(torch, e.dtype.removeprefix("torch."))
    return buf[e.offset : e.offset + e.nbytes].view(dtype).view(e.shape)


def pack(buf: torch.Tensor, plan: list[Entry], named: dict[str, torch.Tensor]) -> None:
    for e in plan:
        _view(buf, e).copy_(named[e.name].detach())


def unpack(buf: torch.Tensor, plan: list[Entry], targets: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for e in plan:
            targets[e.name].detach().copy_(_view(buf, e))


def checksum(model: torch.nn.Module) -> int:
    """Σ over distinct tensors of the sum of their bit patterns as integers (exact, order-free)."""
    seen: set[int] = set()
    total = 0
    for t in named_tensors(model).values():
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += int(t.detach().reshape(-1).view(_INT_VIEW[t.element_size()]).sum(dtype=torch.int64))
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --- the two processes ------------------------------------------------------------------------------------
def _collective(rank: int, model: torch.nn.Module, bucket_bytes: int, device: torch.device) -> dict[str, Any]:
    named = named_tensors(model)
    plans = plan_buckets(named, bucket_bytes) if rank == 0 else None
    box = [plans]
    dist.broadcast_object_list(box, src=0)
    plans = box[0]
    buf = torch.empty(max(packed_size(p) for p in plans), dtype=torch.uint8, device=device)
    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    for plan in plans:
        size = packed_size(plan)
        if rank == 0:
            pack(buf, plan, named)
        dist.broadcast(buf[:size], src=0)
        if rank == 1:
            unpack(buf, plan, named)
    _sync(device)
    dist.barrier()
    return {
        "seconds": time.perf_counter() - start,
        "buckets": len(plans),
        "bytes": sum(e.nbytes for p in plans for e in p),
    }


def _ipc_sender(
    model: torch.nn.Module, bucket_bytes: int, device: torch.device, data_q: Any, ack_q: Any
) -> dict[str, Any]:
    named = named_tensors(model)
    plans = plan_buckets(named, bucket_bytes)
    size = max(packed_size(p) for p in plans)
    bufs = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
    data_q.put(("buffers", bufs))
    ack_q.get(timeout=120)  # the receiver holds the buffers
    _sync(device)
    start = time.perf_counter()
    for k, plan in enumerate(plans):
        if k >= 2:
            ack_q.get(timeout=120)  # bucket k-2 consumed: its buffer is free
        pack(bufs[k % 2], plan, named)
        _sync(device)
        data_q.put(("bucket", k % 2, plan))
    for _ in range(min(2, len(plans))):
        ack_q.get(timeout=120)
    seconds = time.perf_counter() - start
    data_q.put(("done", None))
    ack_q.get(timeout=120)  # the receiver dropped its handles
    return {"seconds": seconds, "buckets": len(plans), "bytes": sum(e.nbytes for p in plans for e in p)}


def _ipc_receiver(model: torch.nn.Module, device: torch.device, data_q: Any, ack_q: Any) -> dict[str, Any]:
    targets = named_tensors(model)
    kind, bufs = data_q.get(timeout=300)
    assert kind == "buffers"
    ack_q.put("ready")
    while True:
        kind, *payload = data_q.get(timeout=120)
        if kind == "done":
            break
        slot, plan = payload
        unpack(bufs[slot], plan, targets)
        _sync(device)
        ack_q.put("ack")
    del bufs
    ack_q.put("released")
    return {}


def _worker(rank: int, cfg: dict[str, Any], out_q: Any, data_q: Any, ack_q: Any) -> None:
    """One of the two processes: build each model (rank-dependent random weights), transfer, verify."""
    try:
        import sys

        sys.path[:0] = [p for p in cfg["sys_path"] if p not in sys.path]
        from gpucheck.models import build_model, load_spec

        device = torch.device(cfg["device"])
        if device.type == "cuda":
            device = torch.device("cuda", 0)  # both processes share the one GPU
            torch.cuda.set_device(device)
        transport = cfg["transport"]
        if transport in ("nccl", "gloo"):
            dist.init_process_group(
                transport,
                init_method=f"tcp://127.0.0.1:{cfg['port']}",
                rank=rank,
                world_size=2,
                device_id=device if transport == "nccl" else None,
            )
            if cfg.get("probe"):
                t = torch.full((1 << 18,), float(rank + 1), device=device)
                dist.broadcast(t, src=0)
                _sync(device)
                out_q.put((rank, {"ok": bool((t == 1).all())}))
                dist.destroy_process_group()
                return
        results = []
        for name in cfg["models"]:
            spec = load_spec(name, cfg["smoke"])
            model = build_model(spec, device, getattr(torch, cfg["dtype"]), seed=rank)
            before = checksum(model)
            if transport == "ipc":
                res = (
                    _ipc_sender(model, cfg["bucket_bytes"], device, data_q, ack_q)
                    if rank == 0
                    else _ipc_receiver(model, device, data_q, ack_q)
                )
            else:
                res = _collective(rank, model, cfg["bucket_bytes"], device)
            res.update({"model": name, "checksum_before": before, "checksum_after": checksum(model)})
            results.append(res)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if dist.is_initialized():
            dist.destroy_process_group()
        out_q.put((rank, {"ok": True, "results": results}))
    except Exception as e:  # noqa: BLE001 — reported to the parent, which records it
        out_q.put(
            (
                rank,
                {
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}"[:1500],
                    "traceback": traceback.format_exc(limit=8)[-3000:],
                },
            )
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_pair(cfg: dict[str, Any], timeout_s: float) -> dict[int, dict[str, Any]]:
    """Start the two processes with `cfg`, wait up to `timeout_s` for both reports, clean up."""
    import torch.multiprocessing as mp

    import gpucheck

    ctx = mp.get_context("spawn")
    out_q, data_q, ack_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(gpucheck.__file__))))
    cfg = {**cfg, "port": _free_port(), "sys_path": [repo, os.path.join(repo, "scripts")]}
    procs = [ctx.Process(target=_worker, args=(r, cfg, out_q, data_q, ack_q), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(reports) < 2 and time.monotonic() < deadline:
        try:
            rank, rep = out_q.get(timeout=1.0)
            reports[rank] = rep
        except queue.Empty:
            if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs) and len(reports) < 2:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in reports]
                for r in dead:
                    reports[r] = {"ok": False, "error": f"process exited with code {procs[r].exitcode}"}
    for r in (0, 1):
        reports.setdefault(r, {"ok": False, "error": f"no report within {timeout_s:.0f}s"})
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    return reports


def summarise(reports: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per-model seconds, GiB and GB/s from the sender, and whether the receiver got the exact bits."""
    if not (reports[0].get("ok") and reports[1].get("ok")):
        bad = {
            r: {k: v for k, v in rep.items() if k != "ok"} for r, rep in reports.items() if not rep.get("ok")
        }
        raise RuntimeError(f"weight sync failed: {bad}")
    out = {}
    for send, recv in zip(reports[0]["results"], reports[1]["results"]):
        exact = recv["checksum_after"] == send["checksum_before"] != recv["checksum_before"]
        out[send["model"]] = {
            "seconds": round(send["seconds"], 4),
            "gib": round(send["bytes"] / 2**30, 3),
            "gb_per_s": round(send["bytes"] / 1e9 / send["seconds"], 2),
            "buckets": send["buckets"],
            "bit_exact": bool(exact),
        }
    return out


def probe_nccl(device: str, timeout_s: float) -> dict[str, Any]:
    """Can two processes on this one device form an NCCL group and broadcast? (Recorded either way.)"""
    reports = run_pair(
        {
            "transport": "nccl",
            "probe": True,
            "device": device,
            "models": [],
            "smoke": True,
            "dtype": "bfloat16",
            "bucket_bytes": 0,
        },
        timeout_s,
    )
    ok = all(rep.get("ok") for rep in reports.values())
    errors = sorted({rep.get("error", "") for rep in reports.values() if not rep.get("ok")})
    return {"ok": ok, "errors": errors}
