"""In-place weight reload for vLLM releases without the layer-wise reload (`compat.layerwise_reload()` False,
e.g. the seed-002 stack's vLLM 0.13).

Without it, a worker loads new weights with the model's own `load_weights` (the same loaders as at start-up:
they shard and fuse q/k/v and gate/up in place, bucket by bucket), then re-runs each layer's
`process_weights_after_loading`. On GPU that is all. The CPU backend, though, packs every linear weight into a
oneDNN / SGL handle after loading and frees the weight (`dispatch_cpu_unquantized_gemm(remove_weight=True)`), so
the loaders would find nothing to write into and the packed handle would keep the old weights. `install()`, run in
the worker before the model loads (the extension module is imported then), keeps the weights; `finish()` repacks
every layer from its new weights. The price is a second copy of the linear weights on CPU (small models only).

Used by `worker_ext` only; imports vLLM inside the functions.
"""

from __future__ import annotations

from typing import Any

_installed = False


def install() -> None:
    """Keep CPU linear weights after packing (idempotent; a no-op where vLLM has no CPU packing)."""
    global _installed
    if _installed:
        return
    try:
        from vllm.model_executor.layers import utils
    except ImportError:
        return
    original = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    if original is None:
        return

    def keep_weights(layer: Any, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    utils.dispatch_cpu_unquantized_gemm = keep_weights
    _installed = True


def finish(model: Any) -> None:
    """Re-run every layer's `process_weights_after_loading` (CPU: repack from the weights just loaded)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
