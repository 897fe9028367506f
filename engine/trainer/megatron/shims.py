"""The only place where megatron-core is patched to run without CUDA (megatron-core 0.16.1, gloo).

Megatron assumes a CUDA device in six places that no config flag reaches:

1. `torch.cuda.current_device()` is used as a *device* (RoPE's `inv_freq.to(...)`, the global memory buffer
   of the local attention). Without CUDA we answer ``"cpu"``.
2. The model-parallel RNG tracker forks the *CUDA* generator (dropout inside tensor-parallel regions).
   Without CUDA we install a tracker with the same seeding rules that forks the CPU generator instead.

3. The pipeline schedules allocate their token counter with `torch.zeros(..., device="cuda")`. The
   `schedules` module's `torch` is replaced by a view of torch whose `zeros` maps device "cuda" to "cpu"
   (nothing else in that module or elsewhere changes); pipeline p2p then runs over gloo.

4. With PP > 1 and tied embeddings, building the last stage calls `weight.data.cuda()` before the
   all-reduce that copies the first stage's embedding. `tensor_cuda_is_identity()` makes `Tensor.cuda`
   return the tensor itself for the duration of the model constructor only (CPU only).

5. Activation recompute (`tensor_parallel.random.checkpoint`) saves and restores the CUDA generator's state
   around the recomputed forward. Without CUDA there is none: the CPU generator (saved there too) is all.

6. Pipeline p2p with variable sequence lengths (`variable_seq_lengths`) exchanges each activation's shape
   first, then calls `torch.cuda.synchronize()` "to protect against a race condition" of batched p2p. The
   process's `torch.cuda.synchronize` becomes a no-op (there is no CUDA to synchronise; gloo's ops were waited
   on).

Patches 1, 2, 3, 5 and 6 are applied only when `torch.cuda.is_available()` is False, and applying them twice is a no-op.
One more fix is needed whenever Transformer Engine is absent (CPU or GPU): 0.16.1's MoE router reads the
module global `te_general_gemm`, which is never defined when the TE import fails (`NameError`); we define
it as None so the router takes its plain `torch.mm` path.
On a GPU `seed_model_parallel_rng` is exactly Megatron's `model_parallel_cuda_manual_seed`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

_APPLIED = False


def cpu_shims_needed() -> bool:
    """True when no CUDA device is usable, i.e. when the shims must be applied."""
    return not torch.cuda.is_available()


def _cpu_current_device() -> str:
    return "cpu"


def fix_missing_te_symbols() -> None:
    """Define `moe_utils.te_general_gemm = None` when Transformer Engine is absent (idempotent)."""
    from megatron.core.transformer.moe import moe_utils

    if not getattr(moe_utils, "HAVE_TE", False) and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


class _TorchZerosOnCPU:
    """`torch`, except that `zeros(..., device="cuda")` allocates on the CPU (for Megatron's schedules)."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: object, device: object = None, **kwargs: object) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


@contextlib.contextmanager
def tensor_cuda_is_identity() -> Iterator[None]:
    """On CPU, `Tensor.cuda()` returns the tensor unchanged inside this block (see point 4); no-op on GPU."""
    if not cpu_shims_needed():
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


def apply_cpu_shims() -> bool:
    """Patch `torch.cuda.current_device` to return "cpu" and the schedules' CUDA zeros (CPU only, idempotent). Returns True if patched.

    Also applies `fix_missing_te_symbols` (on every device)."""
    global _APPLIED
    fix_missing_te_symbols()
    if not cpu_shims_needed():
        return False
    if not _APPLIED:
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.tensor_parallel import random as mpu_random

        torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]
        schedules.torch = _TorchZerosOnCPU()  # type: ignore[assignment]
        # point 5: activation recompute saves and restores the CUDA generator; the CPU one is saved already
        mpu_random._get_cuda_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
        mpu_random._set_cuda_rng_state = lambda *a, **k: None
        torch.cuda.synchronize = lambda *a, **k: None  # point 6: nothing to synchronise without CUDA
        _APPLIED = True
    return True


@functools.cache
def cpu_tracker_class() -> type:
    """A `CudaRNGStatesTracker` whose named states are CPU generator states (built lazily: imports Megatron)."""
    from megatron.core.tensor_parallel import random as mpu_random

    class CPURNGStatesTracker(mpu_random.CudaRNGStatesTracker):
        """Named RNG streams over the CPU generator; `fork(name)` runs a block on stream `name`."""

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise ValueError(f"seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"rng state {name} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            outer = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)

        @contextlib.contextmanager
        def fork(self, name: str = mpu_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise KeyError(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CPURNGStatesTracker


def seed_model_parallel_rng(seed: int) -> None:
    """Seed Megatron's data-, tensor- and expert-parallel RNG streams (after `initialize_model_parallel`).

    Stream seeds follow Megatron: data-parallel = seed, tensor-parallel = seed + 2718 + tp_rank,
    expert-parallel = seed + 1024 + 100·ep_rank + etp_rank. On CPU the streams live on the CPU generator.
    """
    from megatron.core.tensor_parallel import random as mpu_random

    if cpu_shims_needed():
        apply_cpu_shims()
        if not isinstance(mpu_random._CUDA_RNG_STATE_TRACKER, cpu_tracker_class()):
            mpu_random._CUDA_RNG_STATE_TRACKER = cpu_tracker_class()()
            mpu_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mpu_random.model_parallel_cuda_manual_seed(seed)
