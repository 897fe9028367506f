"""`trainer.deterministic = true`: the settings a bit-reproducible run needs (see docs/determinism.md).

Refused (errors): a non-CPU device, a non-fp32 trainer or rollout, a rollout backend other than `hf`, more
than one rollout replica, `stale_policy = "wait"` with a hard cap (its postponement follows the rollouter's
progress), dynamic sampling (`algorithm.filter_groups`: a replaced prompt shifts the schedule). Noted (info): partial rollout is turned off (a resumed prefix is re-prefilled, which rounds
differently from the decode steps that produced it).
"""

from __future__ import annotations

from engine.plan.hardware import HardwarePreset
from asyncrl_cli.config.problems import Problem
from engine.config.schema import RunConfig

KEY = "trainer.deterministic"


def determinism_rules(cfg: RunConfig, hw: HardwarePreset) -> list[Problem]:
    """Errors for the settings that break a deterministic run; empty when it is off."""
    if not cfg.trainer.deterministic:
        return []
    from engine.plan.sizes import rollout_replicas

    out: list[Problem] = []

    def refuse(key: str, what: str, hint: str) -> None:
        out.append(Problem("error", "deterministic-unsupported", f"trainer.deterministic = true needs {what}",
                           key, hint=hint, category="invalid"))

    if hw.device != "cpu":
        refuse("resources.hardware", f"CPU hardware (got '{hw.name}', device {hw.device})",
               "GPU kernels (atomics, split reductions) are not bit-reproducible here; use a CPU preset")
    if cfg.model.dtype != "float32":
        refuse("model.dtype", f"model.dtype = \"float32\" (got {cfg.model.dtype!r})", "set model.dtype = \"float32\"")
    if cfg.trainer.precision not in (None, "fp32"):
        refuse("trainer.precision", f"fp32 compute (got {cfg.trainer.precision!r})", "remove trainer.precision")
    if cfg.rollout.dtype not in (None, "fp32"):
        refuse("rollout.dtype", f"an fp32 rollout (got {cfg.rollout.dtype!r})", "remove rollout.dtype")
    if cfg.rollout.backend != "hf":
        refuse("rollout.backend", f"the hf rollout backend (got {cfg.rollout.backend!r})",
               "vLLM batches requests by arrival; set rollout.backend = \"hf\"")
    if cfg.rollout.multi_turn.enable:
        refuse("rollout.multi_turn.enable", "single-turn rollouts",
               "tool latencies decide when a conversation's next turn is generated; turn multi_turn off")
    if cfg.algorithm.filter_groups.enable:
        refuse("algorithm.filter_groups.enable", "every prompt trained in stream order",
               "dynamic sampling replaces dropped prompts, which moves every later prompt to another step and "
               "version; turn filter_groups off")
    replicas = rollout_replicas(cfg)
    if replicas != 1:
        refuse("resources.rollout.gpus_per_node", f"one rollout replica (got {replicas})",
               "which replica generates a prompt depends on timing; set resources.rollout to 1 node × 1")
    ac = cfg.async_training
    if ac.max_staleness_versions is not None and ac.stale_policy == "wait":
        refuse("async_training.stale_policy", "stale_policy = \"drop\" when max_staleness_versions is set",
               "a postponed sync admits prompts as the rollouter progresses; use \"drop\"")
    if ac.partial_rollout and ac.mode != "sync":
        out.append(Problem("info", "deterministic-partial-rollout", "partial rollout is off in deterministic "
                           "mode: a sync waits for the current version's generations instead of interrupting "
                           "them", "async_training.partial_rollout"))
    return out
