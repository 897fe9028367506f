"""A trainer of M > 1 ranks (`resources.trainer.nnodes × gpus_per_node`; on CPU hardware a "GPU" is a worker
process): FSDP2 (`engine.trainer.fsdp`, DP = M) or Megatron (`engine.trainer.megatron`, DP = M / (TP·PP·CP),
experts split EP ways inside DP) across M Ray actors.

Rank 0 is the `Trainer` actor. Its `TrainerCore` is the only rank that talks to the queue, the rollouter and the
controller; it sees the ranks through a `BackendGroup`, which has the `TrainerBackend` methods the loop calls.
Ranks 1 … M−1 are `TrainerRank` actors that only compute:

    TrainerCore ─▶ BackendGroup.train_step(batch)
                     ├─ shard_rows(batch, DP): DP contiguous row shards, sizes as equal as possible (with token
                     │  budgets: equal-sized token-balanced shards, verl's balance_batch; results back in row order)
                     ├─ rank r gets shard dp(r) (`.remote`)             ┐ together: FSDP2 / Megatron
                     └─ rank 0 its shard dp(0) = 0 on its own backend   ┘ collectives (gloo / NCCL)
                   ◀─ rank 0's metrics (already global: the backend reduces them over the DP ranks);
                      log-prob tensors of one leader per DP index, concatenated in row order

dp(r) is the rank's data-parallel index as the backend reports it (FSDP2: r; Megatron: its
`parallel_state` DP rank, so the TP/CP peers of one DP replica get the same rows, as Megatron needs). Each DP
index's lowest rank is its leader: its log-probs (π_θ and the proximal π_prox alike) and its loss observations
stand for the replica's (its TP peers computed the same numbers).

Collective calls without data (`snapshot_params`, `snapshot_swap`, `export_weights`, `save`, `load`,
`save_version`, `load_version`, `set_lr`) run on every rank; `export_weights` yields rank 0's buckets while the
other ranks drop theirs (they are empty). Ray runs a caller's calls to an actor in order, so all ranks meet the
collectives in the same order.

Start-up: rank 0 picks the rendezvous (`free_port()` on its node's IP), creates the worker actors, joins the
process group itself and builds its backends while they do the same, then waits for them to be ready.
The ranks compute on the plan's trainer device (`RoleDevice`, handed to every rank), so the process group is gloo
on CPU, `cpu:gloo,cuda:nccl` on CUDA, `cpu:gloo,npu:hccl` on NPUs (`engine.trainer.process_groups`).
The worker actors are owned by rank 0's actor and die with it. A failure on any rank fails the call in progress
(a rank still inside a collective gives up after the process group's timeout, 300 s) and breaks the group: later
calls raise at once instead of waiting on a dead peer, and the run resumes from its last checkpoint.
Checkpoints are written by every rank into the same directory (rank 0 the weights and optimizer, each rank its
RNG state; Megatron: every rank its optimizer shard, RNG and snapshot, rank 0 the gathered HF weights), so
multi-node groups need a shared filesystem for `checkpoint.dir`. Ray options per rank (`rank_options`: one
dict for all, or a list indexed by rank) place each rank on its placement-group bundle.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray

from engine.plan.roles import TrainerSpec
from engine.runtime.backends import build_reference_backend, build_trainer_backend

POLICY, REF = "policy", "ref"
"""Names of the two backends a rank may hold: the trained policy and the frozen reference (KL loss)."""


def rank_backends(spec: TrainerSpec) -> dict[str, Any]:
    """This rank's FSDP2 / Megatron backends (process group already joined) on the spec's device: the policy and,
    with the KL loss (`LossSpec.use_kl_loss`), the frozen reference (no gradients, optimizer or DDP wrapper) —
    built in the same order on every rank, since building them is collective."""
    out = {POLICY: build_trainer_backend(spec.backend, spec.model_dir, distributed=True, device=spec.device)}
    if spec.loss.use_kl_loss:
        out[REF] = build_reference_backend(spec.backend, spec.model_dir, distributed=True, device=spec.device)
    return out


@ray.remote
class TrainerRank:
    """Rank r ≥ 1 of a trainer group: joins the process group, builds the same backends and loss function as
    rank 0 (from the same `TrainerSpec`), and runs the shard or collective call rank 0 sends it."""

    def __init__(self, spec: TrainerSpec, rank: int, master_port: int, master_addr: str) -> None:
        import torch

        from engine.algo.loss import build_loss_fn
        from engine.algo.batching import LogRatioObserver
        from engine.trainer.fsdp import init_distributed

        torch.set_num_threads(max(1, spec.threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.manual_seed(spec.backend.seed)
        init_distributed(rank, spec.world, master_port, master_addr, device=spec.device)
        self.rank = rank
        self.backends = rank_backends(spec)
        self.loss_fn = LogRatioObserver(build_loss_fn(spec.loss, spec.loss.rollout_correction))

    def ready(self) -> tuple[int, int]:
        """This rank's pid and data-parallel index, once its backends are built."""
        return os.getpid(), dp_rank(self.backends[POLICY], self.rank)

    def call(self, which: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method(*args, **kwargs)` of backend `which` (POLICY or REF)."""
        return getattr(self.backends[which], method)(*args, **kwargs)

    def train_step(self, which: str, shard: Any) -> tuple[dict[str, float], Any]:
        """One local step on this rank's shard; returns the metrics and what the loss observed (`drain()`)."""
        metrics = self.backends[which].train_step(shard, self.loss_fn)
        return metrics, self.loss_fn.drain()

    def export_weights(self, which: str, bucket_bytes: int) -> None:
        """Take part in the collective full-state-dict gather; this rank's buckets are empty and dropped."""
        for _ in self.backends[which].export_weights(bucket_bytes):
            pass


def dp_rank(backend: Any, rank: int) -> int:
    """The data-parallel index of `backend` (Megatron reports its own; FSDP2's is the global rank)."""
    return int(getattr(backend, "dp_rank", rank))


def dp_leaders(dp_of: list[int]) -> list[int]:
    """The lowest rank of each DP index, in DP order (`dp_of[r]` = rank r's DP index; every index present)."""
    leaders: dict[int, int] = {}
    for r, d in enumerate(dp_of):
        leaders.setdefault(d, r)
    if sorted(leaders) != list(range(len(leaders))):
        raise RuntimeError(f"data-parallel indices {sorted(leaders)} are not 0 … {len(leaders) - 1}")
    return [leaders[d] for d in range(len(leaders))]


class TrainerGroup:
    """The M = `spec.world` ranks of one trainer, seen from rank 0: `policy` and `ref` (None without KL loss) are
    the `BackendGroup`s `TrainerCore` uses in place of its backends. The spec's `rank_options` (one dict for all,
    or a list by rank) place the ranks."""

    def __init__(self, spec: TrainerSpec) -> None:
        from engine.trainer.fsdp import free_port, init_distributed

        world = spec.world
        if world < 2:
            raise ValueError(f"a trainer group needs at least 2 ranks, got {world}")
        self.world = world
        self.balance = spec.backend.update.use_dynamic_bsz  # token-balanced DP shards with token budgets
        self.broken: str | None = None
        port, addr = free_port(), ray.util.get_node_ip_address()
        # the workers first: every rank must be inside init_process_group at the same time
        opts = spec.rank_options
        per_rank = opts if isinstance(opts, list) else [opts or {}] * world
        self.workers = [TrainerRank.options(**per_rank[r]).remote(spec, r, port, addr) for r in range(1, world)]
        init_distributed(0, world, port, addr, device=spec.device)
        local = rank_backends(spec)
        ready = ray.get([w.ready.remote() for w in self.workers])
        self.pids: list[int] = [pid for pid, _ in ready]
        self.dp_of = [dp_rank(local[POLICY], 0), *(d for _, d in ready)]
        """rank → its data-parallel index."""
        self.leaders = dp_leaders(self.dp_of)
        """DP index → the rank whose log-probs and loss observations stand for that replica."""
        self.policy = BackendGroup(self, local[POLICY], POLICY)
        self.ref = BackendGroup(self, local[REF], REF) if REF in local else None

    def close(self) -> None:
        """Stop the worker ranks and leave the process group."""
        import torch.distributed as dist

        for w in self.workers:
            ray.kill(w, no_restart=True)
        if dist.is_initialized():
            dist.destroy_process_group()


class BackendGroup:
    """Rank 0's stand-in for one backend (POLICY or REF) of a `TrainerGroup`: the `TrainerBackend` methods, each
    run by all ranks together (data calls on row shards, the rest on every rank)."""

    def __init__(self, group: TrainerGroup, local: Any, which: str) -> None:
        self.group, self.local, self.which = group, local, which

    @property
    def world_size(self) -> int:
        return self.group.world

    @property
    def dp_size(self) -> int:
        return len(self.group.leaders)

    # --- plumbing ---------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self.group.broken:
            raise RuntimeError(f"the trainer group is broken ({self.group.broken}); resume from a checkpoint")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Marks the group broken when the block raises (an early-closed generator is not a failure)."""
        try:
            yield
        except GeneratorExit:
            raise
        except BaseException as e:
            self.group.broken = f"{type(e).__name__} in {self.which} backend call"
            raise

    def _run(self, local_fn: Callable[[], Any], remote_fn: Callable[[Any, int], Any]) -> tuple[Any, list[Any]]:
        """Submit `remote_fn(worker, rank)` to every worker, run `local_fn()` here meanwhile; both results."""
        self._check()
        with self._guard():
            refs = [remote_fn(w, r) for r, w in enumerate(self.group.workers, start=1)]
            out = local_fn()
            return out, ray.get(refs)

    def _on_all(self, method: str, *args: Any) -> Any:
        """`method(*args)` on every rank; rank 0's result."""
        out, _ = self._run(lambda: getattr(self.local, method)(*args),
                           lambda w, r: w.call.remote(self.which, method, *args))
        return out

    def _shards(self, batch: Any) -> list[Any]:
        """Rank r's rows: DP shard dp(r) (the TP/CP peers of one DP replica get the same shard); token-balanced
        shards with token budgets (`shard_indices`)."""
        from engine.trainer.batch import shard_rows

        by_dp = shard_rows(batch, self.dp_size, balance=self.group.balance)
        return [by_dp[d] for d in self.group.dp_of]

    def _in_row_order(self, batch: Any, parts: list[Any]) -> Any:
        """The leaders' [rows, R] results, concatenated and put back in the batch's row order."""
        import torch

        from engine.trainer.batch import shard_indices

        out = torch.cat(parts)
        if not self.group.balance:
            return out
        order = [i for idx in shard_indices(batch, self.dp_size, balance=True) for i in idx]
        return out[torch.argsort(torch.tensor(order, dtype=torch.long))]

    def _leaders_parts(self, first: Any, rest: list[Any]) -> list[Any]:
        """Rank 0's result and the workers' (`rest[r - 1]` is rank r's), reduced to one per DP index."""
        parts = [first, *rest]
        return [parts[r] for r in self.group.leaders]

    # --- data -------------------------------------------------------------------------------------------
    def compute_log_probs(self, batch: Any, *, with_entropy: bool = False) -> tuple[Any, Any]:
        """log π_θ [B, R] (and entropy) of the whole batch: each rank its shard, concatenated in row order."""

        shards = self._shards(batch)
        first, rest = self._run(
            lambda: self.local.compute_log_probs(shards[0], with_entropy=with_entropy),
            lambda w, r: w.call.remote(self.which, "compute_log_probs", shards[r], with_entropy=with_entropy))
        parts = self._leaders_parts(first, rest)
        log_probs = self._in_row_order(batch, [lp for lp, _ in parts])
        return log_probs, self._in_row_order(batch, [ent for _, ent in parts]) if with_entropy else None

    def proximal_log_probs(self, batch: Any) -> Any:
        """log π_prox [B, R] of the whole batch (every rank swaps its own snapshot shards in)."""

        shards = self._shards(batch)
        first, rest = self._run(lambda: self.local.proximal_log_probs(shards[0]),
                                lambda w, r: w.call.remote(self.which, "proximal_log_probs", shards[r]))
        return self._in_row_order(batch, self._leaders_parts(first, rest))

    def train_step(self, batch: Any, loss_fn: Any) -> dict[str, float]:
        """One local step over the whole batch (each rank its shard, gradients reduced by FSDP); rank 0's
        metrics. The other ranks use their own copy of the loss; what they observed goes into `loss_fn.extend`
        when it has one (`LogRatioObserver`)."""
        shards = self._shards(batch)
        metrics, rest = self._run(lambda: self.local.train_step(shards[0], loss_fn),
                                  lambda w, r: w.train_step.remote(self.which, shards[r]))
        if hasattr(loss_fn, "extend"):  # the other DP replicas' rows (rank 0 observed its own replica's)
            loss_fn.extend([rest[r - 1][1] for r in self.group.leaders[1:]])
        return metrics

    # --- collective, no data ----------------------------------------------------------------------------
    def snapshot_params(self) -> None:
        self._on_all("snapshot_params")

    def snapshot_swap(self, to_snapshot: bool) -> None:
        self._on_all("snapshot_swap", to_snapshot)

    def save_version(self, path: str) -> None:
        self._on_all("save_version", path)

    def load_version(self, path: str) -> bool:
        return bool(self._on_all("load_version", path))

    def export_weights(self, bucket_bytes: int) -> Iterator[dict[str, Any]]:
        """Rank 0's buckets of the full weights, as it makes them; the other ranks join the gather and drop
        theirs."""
        self._check()
        with self._guard():
            refs = [w.export_weights.remote(self.which, bucket_bytes) for w in self.group.workers]
            yield from self.local.export_weights(bucket_bytes)
            ray.get(refs)

    def save(self, path: str) -> None:
        self._on_all("save", path)

    def load(self, path: str) -> None:
        self._on_all("load", path)

    def set_lr(self, lr: float) -> None:
        self._on_all("set_lr", lr)

    def current_lr(self) -> float:
        return self.local.current_lr()
