"""vLLM worker extension: in-place weight reload from HF-named safetensors, one bucket at a time.

vLLM mixes this class into every worker of a replica (`worker_extension_cls=` in the engine args), so
`self` is the vLLM worker and each method is reachable with `collective_rpc("<method>", args=...)`. With
tensor parallelism every worker receives the full HF tensors and the model's own weight loaders shard
and fuse them (q/k/v → qkv_proj, gate/up → gate_up_proj) exactly as at start-up.

One update is a session, the same three steps as vLLM's `model_runner.reload_weights`, split so the
weights can arrive in several buckets:

    asyncrl_begin_update()            layer-wise reload armed: each layer's new tensors are buffered until
                                      the layer is complete, then loaded and post-processed (CPU repacking)
    asyncrl_load_bytes(blob) | asyncrl_load_file(path)    × number of buckets
    asyncrl_finish_update()           layers that received nothing keep their current tensors

A fused layer may therefore be split across buckets. Only bytes or a file path cross the RPC boundary
(vLLM's multiprocess transport cannot carry tensors). `model.load_weights` alone cannot be used after
start-up: the CPU backend repacks linear weights, so the plain loaders no longer fit the parameters.

This module stays importable without vLLM: vLLM, torch and safetensors are imported inside the methods.
"""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Methods added to the vLLM worker. The load methods return the number of tensors received."""

    model_runner: Any  # set by the vLLM worker this class is mixed into

    def asyncrl_begin_update(self) -> None:
        """Arm the layer-wise reload (vLLM restores each layer's checkpoint-format shapes on `meta`)."""
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def asyncrl_load_bytes(self, blob: bytes) -> int:
        """Feed one safetensors-serialised `{hf_name: tensor}` bucket to the model's weight loaders."""
        from safetensors.torch import load

        return self._asyncrl_feed(load(bytes(blob)))

    def asyncrl_load_file(self, path: str) -> int:
        """Feed one safetensors file (typically under /dev/shm); the caller deletes it afterwards."""
        from safetensors.torch import load_file

        return self._asyncrl_feed(load_file(path))

    def asyncrl_finish_update(self) -> None:
        """Process the layers still pending, restore untouched ones and drop caches derived from weights."""
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner
        finalize_layerwise_reload(runner.get_model(), runner.model_config)
        runner.reset_lora_state()
        runner.reset_encoder_cache()
        runner.reset_mm_cache()

    def _asyncrl_feed(self, state: dict[str, Any]) -> int:
        self.model_runner.get_model().load_weights(iter(state.items()))
        return len(state)
