"""A short fully-asynchronous GRPO loop without Ray: a rollout thread (`HFRolloutBackend` on its own copy
of the model) and the trainer (`TorchTrainerBackend`) run concurrently on one device, joined by a bounded
queue of one batch. The rollout thread loads new weights only between batches, so a trained batch is at
most two versions old (one batch queued, one being generated while the trainer steps): staleness ≤ 2,
reported as a histogram. After every optimizer step the trainer stages its HF-named weights in
buckets (`engine.sync.buckets.bucketize`, device copies) and the rollout thread loads them before its next
batch (colocated sync; `version` + 1). Loss: the runtime's GRPO loss in bypass mode (π_old = π_rollout),
so `rollout_corr/kl` = mean(log q − log π_θ) is the mismatch the trainer saw. Reward: `parity_reward`.
"""

from __future__ import annotations

import copy
import queue
import statistics
import threading
import time
from typing import Any

import torch

from engine.algo.loss import GRPOLoss
from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.sync.apply import named_tensors
from engine.sync.buckets import bucketize
from engine.trainer.torch_trainer import TorchTrainerBackend
from gpucheck.batches import batch_tokens, groups_from_results, random_prompts, requests_for, train_batch
from gpucheck.models import ModelSpec
from gpucheck.report import cuda_sync
from gpucheck.trainer_bench import OPTIM


class _WeightSlot:
    """The latest staged weights (version, buckets of device tensors); the rollout side takes them once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._item: tuple[int, list[dict[str, torch.Tensor]]] | None = None

    def put(self, version: int, buckets: list[dict[str, torch.Tensor]]) -> None:
        with self._lock:
            self._item = (version, buckets)

    def take(self) -> tuple[int, list[dict[str, torch.Tensor]]] | None:
        with self._lock:
            item, self._item = self._item, None
            return item


def _stage(model: torch.nn.Module, bucket_bytes: int) -> list[dict[str, torch.Tensor]]:
    with torch.no_grad():
        return list(
            bucketize(((n, t.detach().clone()) for n, t in named_tensors(model).items()), bucket_bytes)
        )


def _load(model: torch.nn.Module, buckets: list[dict[str, torch.Tensor]]) -> None:
    targets = named_tensors(model)
    with torch.no_grad():
        for bucket in buckets:
            for name, t in bucket.items():
                targets[name].copy_(t)


def run_async_loop(
    model: torch.nn.Module,
    spec: ModelSpec,
    device: str,
    *,
    steps: int,
    prompts: int,
    n: int,
    prompt_len: int,
    new_tokens: int,
    micro: int,
    bucket_bytes: int,
    time_limit_s: float,
    seed: int = 0,
) -> dict[str, Any]:
    """Run up to `steps` trainer steps (or until `time_limit_s`); returns throughput and learning metrics."""
    rollout_model = copy.deepcopy(model)
    rollout = HFRolloutBackend(
        rollout_model,
        eos_token_id=spec.eos_id,
        pad_token_id=spec.eos_id,
        max_batch_size=prompts * n,
        device=device,
    )
    trainer = TorchTrainerBackend(
        model, optim_cfg=OPTIM, grad_clip=1.0, micro_batch_size=micro, temperature=1.0, device=device
    )
    batches: queue.Queue = queue.Queue(maxsize=1)
    slot, stop = _WeightSlot(), threading.Event()
    gen_s: list[float] = []
    load_s: list[float] = []
    errors: list[str] = []

    def rollout_loop() -> None:
        k = 0
        try:
            while not stop.is_set():
                staged = slot.take()
                if staged is not None:
                    t0 = time.perf_counter()
                    _load(rollout.model, staged[1])
                    cuda_sync()
                    rollout.version = staged[0]
                    load_s.append(time.perf_counter() - t0)
                ids = random_prompts(prompts, prompt_len, spec.vocab_size, {spec.eos_id}, seed + k)
                t0 = time.perf_counter()
                res = rollout.generate(
                    requests_for(ids, n, new_tokens, f"s{k}"), SamplingParams(1.0, seed=seed + k)
                )
                gen_s.append(time.perf_counter() - t0)
                groups = groups_from_results(ids, n, res, epoch=k)
                while not stop.is_set():
                    try:
                        batches.put(groups, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                k += 1
        except Exception as e:  # noqa: BLE001 — surfaced in the report
            errors.append(f"rollout: {type(e).__name__}: {e}")
            stop.set()

    thread = threading.Thread(target=rollout_loop, daemon=True)
    loss_fn = GRPOLoss()
    version, records = 0, []
    start = time.perf_counter()
    thread.start()
    try:
        while len(records) < steps and time.perf_counter() - start < time_limit_s and not stop.is_set():
            t0 = time.perf_counter()
            try:
                groups = batches.get(timeout=1.0)
            except queue.Empty:
                continue
            wait = time.perf_counter() - t0
            batch = train_batch(groups, spec.eos_id)
            t1 = time.perf_counter()
            metrics = trainer.train_step(batch, loss_fn)
            cuda_sync()
            t2 = time.perf_counter()
            version += 1
            slot.put(version, _stage(trainer.model, bucket_bytes))
            cuda_sync()
            records.append(
                {
                    "wait_s": wait,
                    "train_s": t2 - t1,
                    "stage_s": time.perf_counter() - t2,
                    "staleness": version - 1 - min(g.min_version for g in groups),
                    "reward": statistics.fmean(t.reward for g in groups for t in g.trajectories),
                    "kl": metrics.get("rollout_corr/kl"),
                    "tokens": batch_tokens(batch),
                    "new_tokens": int(batch.response_mask.sum()),
                }
            )
    finally:
        stop.set()
        thread.join(timeout=60)
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError("; ".join(errors))
    if not records:
        raise RuntimeError("the async loop made no trainer step")
    head, tail = records[: max(1, len(records) // 4)], records[-max(1, len(records) // 4) :]
    return {
        "steps": len(records),
        "wall_s": round(wall, 2),
        "steps_per_s": round(len(records) / wall, 3),
        "rollout_tokens_per_s": round(sum(r["new_tokens"] for r in records) / wall, 1),
        "trainer_tokens_per_s": round(sum(r["tokens"] for r in records) / wall, 1),
        "mean_generate_s": round(statistics.fmean(gen_s), 3),
        "mean_train_step_s": round(statistics.fmean(r["train_s"] for r in records), 3),
        "mean_weight_stage_s": round(statistics.fmean(r["stage_s"] for r in records), 4),
        "mean_weight_load_s": round(statistics.fmean(load_s), 4) if load_s else None,
        "trainer_idle_ratio": round(sum(r["wait_s"] for r in records) / wall, 3),
        "staleness_hist": {
            str(s): sum(r["staleness"] == s for r in records)
            for s in sorted({r["staleness"] for r in records})
        },
        "rollout_corr_kl_mean_abs": round(
            statistics.fmean(abs(r["kl"]) for r in records if r["kl"] is not None), 6
        )
        if any(r["kl"] is not None for r in records)
        else None,
        "reward_first_quarter": round(statistics.fmean(r["reward"] for r in head), 4),
        "reward_last_quarter": round(statistics.fmean(r["reward"] for r in tail), 4),
        "final_version": version,
    }
