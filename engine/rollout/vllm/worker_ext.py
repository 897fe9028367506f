"""vLLM worker extension: in-place weight reload from flat weight buckets, one bucket at a time.

vLLM mixes this class into every worker of a replica (`worker_extension_cls=` in the engine args), so
`self` is the vLLM worker and each method is reachable with `collective_rpc("<method>", args=...)`. With
tensor parallelism every worker receives the full HF tensors and the model's own weight loaders shard
and fuse them (q/k/v → qkv_proj, gate/up → gate_up_proj) exactly as at start-up; with expert parallelism
the MoE loader keeps only the experts the worker serves (`asyncrl_layout` says which share it holds).

One update is a session, the same three steps as vLLM's `model_runner.reload_weights`, split so the
weights can arrive in several buckets:

    asyncrl_begin_update()            layer-wise reload armed: each layer's new tensors are buffered until
                                      the layer is complete, then loaded and post-processed (CPU repacking)
    asyncrl_load_flat(index, blob, tied)    × number of buckets (object-store sync: bytes through the RPC)
      or asyncrl_receive_collective(handle, first_rank, tied)   once: the collective weight sync
    asyncrl_finish_update()           layers that received nothing keep their current tensors

Collective weight sync (`rollout.weight_sync = "collective"`, `engine.sync.collective`): each worker joins the
trainer's broadcast group itself, as group rank `first_rank` + its rank in the replica (`_asyncrl_replica_rank`:
data parallel rank × TP × PP + its rank in its engine core), and feeds the buckets to the loaders as they arrive
(bucket k loaded while k+1 is received), so the weights never pass through the replica's driver process; it returns each bucket's fingerprint for the trainer's delivery check. Gloo on CPU
(tested); NCCL on CUDA uses the same code with a `ProcessGroupNCCL` on the worker's GPU — UNTESTED here (no
GPU). vLLM 0.32 also ships a native weight-transfer engine (`weight_transfer_config`, backend "nccl":
`NCCLWeightTransferEngine` in the worker, `NCCLTrainerWeightTransferEngine` on the trainer); it is not used
because its trainer side needs vLLM in the trainer's environment and drives the inference engine through its
own client, and it has no CPU backend.

A fused layer may therefore be split across buckets. Only bytes cross the RPC boundary
(vLLM's multiprocess transport cannot carry tensors). `model.load_weights` alone cannot be used after
start-up: the CPU backend repacks linear weights, so the plain loaders no longer fit the parameters.

This module stays importable without vLLM: vLLM and torch are imported inside the methods. On a vLLM without
the layer-wise reload (0.13) the begin / finish steps are `legacy_reload`'s (`compat`).
"""

from __future__ import annotations

from typing import Any

from engine.rollout.vllm import legacy_reload
from engine.rollout.vllm.compat import layerwise_reload

LAYERWISE = layerwise_reload()
if not LAYERWISE:  # imported by the worker before its model loads: keep CPU weights reloadable
    legacy_reload.install()


class WeightSyncExtension:
    """Methods added to the vLLM worker. The load methods return the number of tensors received."""

    model_runner: Any  # set by the vLLM worker this class is mixed into
    parallel_config: Any

    def asyncrl_begin_update(self) -> None:
        """Arm the layer-wise reload (vLLM restores each layer's checkpoint-format shapes on `meta`)."""
        if not LAYERWISE:
            return
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def asyncrl_load_flat(self, index: list, blob: bytes, tied: bool) -> list:
        """Feed one flat bucket (`engine.sync.flat`: its index and raw bytes) to the model's weight loaders; the
        tensors are views of `blob`, in the sender's dtype. Returns [tensors fed, the fingerprint of the bytes this
        worker received] — every worker's own receipt for the delivery check (`engine.sync.verify`)."""
        import warnings

        import torch

        from engine.sync.flat import FlatBucket, fingerprint

        with warnings.catch_warnings():  # read only
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            data = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.zeros(0, dtype=torch.uint8)
        fb = FlatBucket([(n, d, tuple(s), int(o), int(b)) for n, d, s, o, b in index], data)
        return [self._asyncrl_feed(self._asyncrl_tensors(fb, tied)), fingerprint(data)]

    def asyncrl_finish_update(self) -> None:
        """Process the layers still pending, restore untouched ones and drop caches derived from weights."""
        runner = self.model_runner
        if LAYERWISE:
            from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

            finalize_layerwise_reload(runner.get_model(), runner.model_config)
        else:
            legacy_reload.finish(runner.get_model())
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # those this vLLM has
            if callable(getattr(runner, reset, None)):
                getattr(runner, reset)()

    def asyncrl_receive_collective(self, handle: dict[str, Any], first_rank: int, tied: bool) -> list:
        """Receive one version of the collective broadcast (`handle`: a `CollectiveHandle` as a dict) as group
        rank `first_rank` + this worker's rank, loading bucket k while bucket k+1 arrives. Returns
        [bytes received, the fingerprint of each bucket received] (the delivery check's receipt)."""
        from engine.sync.collective import CollectiveHandle, pull
        from engine.sync.flat import fingerprint
        from engine.sync.pipeline import ahead

        nbytes, sums = 0, []
        for fb in ahead(pull(CollectiveHandle(**handle), int(first_rank) + self._asyncrl_replica_rank())):
            sums.append(fingerprint(fb.data))
            nbytes += fb.nbytes
            self._asyncrl_feed(self._asyncrl_tensors(fb, tied))
        return [nbytes, sums]

    def asyncrl_weights_fingerprint(self) -> int:
        """A sample fingerprint of this worker's loaded weights (`engine.sync.verify.weights_fingerprint`)."""
        from engine.sync.verify import weights_fingerprint

        return weights_fingerprint(self.model_runner.get_model().state_dict().values())

    def asyncrl_layout(self) -> dict[str, Any]:
        """This worker's place in its replica — `rank` (`_asyncrl_replica_rank`), `dp_rank`, `ep_rank` / `ep_size`
        (vLLM's expert-parallel group, which it builds over the TP × DP workers of a MoE model whether or not the
        experts are spread; 1 for a dense model) — and `experts`: for each routed-expert
        parameter of the first MoE layer, how many experts it holds here (all of them without expert parallelism,
        its 1 / EP share with it)."""
        from vllm.distributed import parallel_state

        experts: dict[str, int] = {}
        for name, param in self.model_runner.get_model().named_parameters():
            if ".experts." in name and (not experts or name.split(".experts.")[0] == next(iter(experts)).split(
                    ".experts.")[0]):
                experts[name] = int(param.shape[0])
        ep = parallel_state.get_ep_group() if experts else None  # vLLM builds the group for MoE models only
        return {"rank": self._asyncrl_replica_rank(), "dp_rank": self._asyncrl_dp_index(),
                "ep_rank": int(ep.rank_in_group) if ep else 0, "ep_size": int(ep.world_size) if ep else 1,
                "experts": experts}

    def _asyncrl_replica_rank(self) -> int:
        """This worker's rank among its replica's TP × PP × DP workers: its data parallel rank's block of TP × PP,
        then its rank inside its engine core (global over the nodes of a replica that spans nodes)."""
        return self._asyncrl_dp_index() * int(self.parallel_config.world_size) + int(getattr(self, "rank", 0))

    def _asyncrl_dp_index(self) -> int:
        """This worker's engine core among the replica's data parallel ones: `data_parallel_index` (vLLM resets
        `data_parallel_rank` to 0 in every core of a dense model, whose cores are independent engines), else the
        rank (releases without the index)."""
        pc = self.parallel_config
        return int(getattr(pc, "data_parallel_index", pc.data_parallel_rank))

    @staticmethod
    def _asyncrl_tensors(fb: Any, tied: bool) -> dict[str, Any]:
        from engine.rollout.vllm.weights import tie_lm_head

        return tie_lm_head(dict(fb.tensors()), tied)

    def _asyncrl_feed(self, state: dict[str, Any]) -> int:
        self.model_runner.get_model().load_weights(iter(state.items()))
        return len(state)
