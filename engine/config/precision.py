"""The trainer's precision policy from the config: which dtype holds each of its four kinds of state.

    compute      = trainer.precision if set, else model.dtype            (forward / backward matmuls)
    params       = fp32 if trainer.fp32_master_weights else compute       (the weights the optimizer updates)
    grad_reduce  = params                                                 (gradient accumulation and all-reduce)
    optimizer    = params                                                 (AdamW moments)

Log-softmax, the loss and the KL/entropy terms are computed in fp32 in every case (`engine.trainer.logprobs`).
Pure Python: the CLI prints this (`launch --dry-run`) and the backends are built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.schema import RunConfig
    from engine.config.sections import TrainerConfig

SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "auto": "auto"}
"""torch dtype name → the short name of `trainer.precision` / `rollout.dtype` ("auto": not decided until the
launch measures, `engine.plan.auto`)."""
LONG = {v: k for k, v in SHORT.items()}


@dataclass(frozen=True)
class PrecisionPolicy:
    """Torch dtype names of the trainer's parameters, compute, gradient reduction and optimizer state."""

    params: str
    compute: str
    grad_reduce: str
    optimizer: str

    @property
    def mixed(self) -> bool:
        """Compute below the parameters' precision (autocast / MixedPrecisionPolicy / fp32 main params)."""
        return self.compute != self.params

    def describe(self) -> str:
        """One line: `params fp32 · compute bf16 · grad-reduce fp32 · optimizer fp32 (fp32 master weights)`."""
        kind = "fp32 master weights" if self.params == "float32" else f"pure {SHORT[self.params]}: no fp32 masters"
        return (f"params {SHORT[self.params]} · compute {SHORT[self.compute]} · grad-reduce "
                f"{SHORT[self.grad_reduce]} · optimizer {SHORT[self.optimizer]} ({kind})")


def trainer_precision(trainer: TrainerConfig, model_dtype: str) -> PrecisionPolicy:
    """The policy of the module docstring for a `TrainerConfig` and `model.dtype`."""
    chosen = trainer.precision
    compute = LONG[chosen] if chosen else model_dtype
    params = "float32" if trainer.fp32_master_weights else compute
    return PrecisionPolicy(params=params, compute=compute, grad_reduce=params, optimizer=params)


def policy_of(cfg: RunConfig) -> PrecisionPolicy:
    """`trainer_precision` of a whole `RunConfig`."""
    return trainer_precision(cfg.trainer, cfg.model.dtype)
