"""The config's cross-field rules: asynchrony, rollout correction and the trainer here; the rules against the
hardware in `hardware_checks`, on the model and paths in `model_checks` (re-exported, so `checks.X_rules`
names every rule the loader runs).

Each rule returns `Problem`s naming the key they concern; the loader adds file and line from the
provenance. Category `fit` (exit 3) is for what the hardware cannot hold (GPU counts per node, parallel
layouts, memory); everything else is `invalid` (exit 1) when an error. Warnings flag settings that would
silently do nothing or are known to hurt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.plan.sizes import Derived
from asyncrl_cli.config.hardware_checks import fit_rules, pitfall_rules, resource_rules
from asyncrl_cli.config.model_checks import model_rules, path_rules
from asyncrl_cli.config.model_checks import megatron_key_backend_rules
from asyncrl_cli.config.problems import Problem, error, note, warn
from asyncrl_cli.config.provenance import Provenance
from engine.config.loss_mode import loss_mode_error
from engine.config.rc_config import parse_rs_options, parse_rs_thresholds
from engine.config.schema import RunConfig
from engine.plan.auto import compute_dtypes, mismatch_uncorrected
from engine.config.precision import SHORT, policy_of

RC = "algorithm.rollout_correction"

__all__ = [
    "async_rules", "correction_rules", "fit_rules", "model_rules", "multi_turn_rules", "path_rules",
    "pitfall_rules", "resource_rules", "trainer_rules",
]  # fmt: skip


def async_rules(cfg: RunConfig, prov: Provenance) -> list[Problem]:
    """Asynchrony settings that contradict each other or do nothing."""
    a = cfg.async_training
    out: list[Problem] = []
    if a.mode == "sync" and a.staleness_threshold > 0 and prov.is_set("async_training.staleness_threshold"):
        out.append(
            warn(
                "sync-staleness",
                "async_training.staleness_threshold",
                f'mode = "sync" forces staleness_threshold to 0 (set to {a.staleness_threshold})',
            )
        )
    off_policy = a.mode == "fully_async" and a.staleness_threshold > 0
    if a.partial_rollout and not off_policy and prov.is_set("async_training.partial_rollout"):
        out.append(
            warn(
                "partial-rollout-noop",
                "async_training.partial_rollout",
                "partial_rollout only matters when rollout runs ahead "
                "(fully_async with staleness_threshold > 0)",
            )
        )
    if a.max_staleness_versions is None and prov.is_set("async_training.stale_policy"):
        out.append(
            warn(
                "stale-policy-noop",
                "async_training.stale_policy",
                "stale_policy has no effect without async_training.max_staleness_versions",
            )
        )
    return out


def multi_turn_rules(cfg: RunConfig, prov: Provenance, base_dir: Path | None = None) -> list[Problem]:
    """`[rollout.multi_turn]`: tools that exist and can run here, and what multi-turn cannot combine with."""
    mt = cfg.rollout.multi_turn
    key = "rollout.multi_turn"
    if not mt.enable:
        set_keys = [k for k in ("tools", "tool_config_path", "max_assistant_turns", "max_user_turns")
                    if prov.is_set(f"{key}.{k}")]
        return [warn("multi-turn-off", f"{key}.{set_keys[0]}", f"{key}.enable is false: {', '.join(set_keys)} "
                     "do nothing")] if set_keys else []
    out: list[Problem] = []
    if not mt.tools and not mt.tool_config_path and not mt.tool:
        out.append(error("multi-turn-no-tools", f"{key}.tools", "multi-turn rollouts need tools: name built-ins "
                         '(tools = ["calculator"]), a verl tool_config_path or [[rollout.multi_turn.tool]]'))
    if mt.tools and mt.tool_config_path:
        out.append(error("multi-turn-two-tool-sources", f"{key}.tool_config_path",
                         "give either tools or tool_config_path, not both"))
    registry = None
    try:
        from engine.agent.tools import run_tools

        if mt.tool_config_path or mt.tools or mt.tool:
            registry = run_tools(mt, base_dir)
    except (OSError, ValueError) as e:
        where = ("tool" if mt.tool and str(e).startswith("tool ") else "tool_config_path" if mt.tool_config_path
                 else "tools" if mt.tools else "tool")
        out.append(error("multi-turn-tools", f"{key}.{where}", str(e)))
    return out + sandbox_rules(cfg, registry)


def sandbox_rules(cfg: RunConfig, registry: Any = None) -> list[Problem]:
    """Where the tools run: a SandboxFusion service (said), the local box opted out of (loud), or a box this
    machine cannot build (the run would refuse)."""
    from engine.agent.box import unavailable_reason

    key = "rollout.multi_turn.allow_unsandboxed"
    out = [warn("tools-sandbox-fusion", "rollout.multi_turn.tool_config_path", f"{remote} (verl's "
                "sandbox_fusion_url): the service must be reachable from the rollouter; nothing runs on the local "
                "box") for remote in (registry.remote() if registry is not None else [])]
    if registry is not None and not registry.needs_box():
        return out
    reason = unavailable_reason()
    if cfg.rollout.multi_turn.allow_unsandboxed:
        here = ("and here they WILL run unsandboxed: " + reason) if reason else "(bubblewrap works here: they are boxed)"
        return out + [warn("tools-unsandboxed", key, "allow_unsandboxed = true: where no sandbox can be built, "
                           f"model-written tool code runs UNISOLATED with the run's own files, network and secrets "
                           f"{here}")]
    if reason:
        out.append(warn("tools-sandbox-unavailable", key, f"on this machine tools would refuse to run: {reason}"))
    return out


def correction_rules(cfg: RunConfig, prov: Provenance) -> list[Problem]:
    """Rollout-correction keys (verl semantics) that conflict or are silently unused."""
    rc = cfg.algorithm.rollout_correction
    out: list[Problem] = []
    if rc.rollout_rs is not None and rc.rollout_rs_threshold is None:
        out.append(
            error(
                "rs-threshold-missing",
                f"{RC}.rollout_rs_threshold",
                f"rollout_rs = {rc.rollout_rs!r} needs rollout_rs_threshold",
                'e.g. "0.999_1.001" for k1 options, 0.01 for k3',
            )
        )
    if rc.rollout_rs is not None and rc.rollout_rs_threshold is not None:
        try:
            parse_rs_thresholds(parse_rs_options(rc.rollout_rs), rc.rollout_rs_threshold)
        except ValueError as e:
            out.append(error("rs-threshold-format", f"{RC}.rollout_rs_threshold", str(e)))
    precision, trainer_compute = compute_dtypes(cfg)  # "auto" (decided at launch) is checked there
    if "auto" not in (precision, trainer_compute) and mismatch_uncorrected(cfg):
        out.append(
            note(
                "precision-mismatch-uncorrected",
                "rollout.dtype",
                f"the rollout runs in {precision}, the trainer in {trainer_compute}, and no rollout correction "
                "is on: per-token ratios of 0.6–1.5 go uncorrected",
                'e.g. [algorithm.rollout_correction] preset = "decoupled_geo_rs_seq_tis"',
            )
        )
    if rc.rollout_rs is None and rc.rollout_rs_threshold is not None:
        out.append(
            warn(
                "rs-threshold-noop",
                f"{RC}.rollout_rs_threshold",
                "rollout_rs_threshold has no effect without rollout_rs",
            )
        )
    if rc.rollout_is is not None and rc.bypass_mode and rc.loss_type == "ppo_clip":
        out.append(
            warn(
                "is-weights-unused",
                f"{RC}.rollout_is",
                f'rollout_is = {rc.rollout_is!r} in bypass mode with loss_type = "ppo_clip": the IS weights '
                "are computed for metrics only and do not touch the loss",
                'set bypass_mode = false (decoupled) or loss_type = "reinforce" to apply them',
            )
        )
    if not rc.bypass_mode and rc.loss_type != "ppo_clip" and prov.is_set(f"{RC}.loss_type"):
        out.append(
            warn(
                "loss-type-noop",
                f"{RC}.loss_type",
                "loss_type only applies in bypass mode (bypass_mode = true)",
            )
        )
    if rc.rollout_is is None and rc.rollout_is_batch_normalize:
        out.append(
            warn(
                "is-normalize-noop",
                f"{RC}.rollout_is_batch_normalize",
                "rollout_is_batch_normalize has no effect without rollout_is",
            )
        )
    if (
        rc.rollout_is is None
        and prov.is_set(f"{RC}.rollout_is_threshold")
        and prov.get(f"{RC}.rollout_is_threshold").kind != "preset"
    ):
        out.append(
            warn(
                "is-threshold-noop",
                f"{RC}.rollout_is_threshold",
                "rollout_is_threshold has no effect without rollout_is",
            )
        )
    return out


def precision_rules(cfg: RunConfig) -> list[Problem]:
    """The trainer's precision policy (`engine.config.precision`): a pure low-precision optimizer is allowed
    only by its explicit key, and said out loud."""
    policy = policy_of(cfg)
    if cfg.trainer.fp32_master_weights or policy.params == "float32":
        return []
    lr = cfg.trainer.optim.lr
    return [
        warn(
            "no-fp32-master-weights",
            "trainer.fp32_master_weights",
            f"WITHOUT fp32 master weights the trainer's parameters, gradients and AdamW state are "
            f"{SHORT[policy.params]}: every update is rounded to {SHORT[policy.params]} (a weight of 0.02 has an "
            f"ulp of ~1.2e-4 in bf16), so at lr = {lr:g} most weights never move and the run does not learn",
            "remove trainer.fp32_master_weights (verl and Megatron keep fp32 masters with bf16 compute)",
        )
    ]


def trainer_rules(cfg: RunConfig, prov: Provenance, d: Derived) -> list[Problem]:
    """Loss, batch and backend settings."""
    t, r = cfg.trainer, cfg.rollout
    out: list[Problem] = []
    if r.n < 2 and cfg.algorithm.adv_estimator == "grpo":
        out.append(
            error(
                "grpo-group-size",
                "rollout.n",
                "GRPO needs at least 2 responses per prompt: with n = 1 every advantage is 0",
            )
        )
    if not t.use_kl_loss:
        for k in ("kl_loss_coef", "kl_loss_type"):
            if prov.is_set(f"trainer.{k}"):
                out.append(
                    warn("kl-noop", f"trainer.{k}", f"trainer.{k} has no effect while use_kl_loss = false")
                )
    problem = loss_mode_error(t, cfg.algorithm.rollout_correction)
    if problem is not None:
        out.append(error("loss-mode", "trainer.loss_mode", problem))
    out += precision_rules(cfg)
    if t.backend == "megatron" and prov.is_set("trainer.attn_implementation"):
        out.append(warn("attn-implementation-ignored", "trainer.attn_implementation",
                        f"trainer.attn_implementation = {t.attn_implementation!r} has no effect with the megatron "
                        "backend: megatron-core runs its own attention (its local kernel, or Transformer Engine's "
                        "on CUDA)", "remove it, or use trainer.backend = \"torch\" to choose the kernel"))
    if t.backend == "torch":
        for k in ("tp", "pp", "cp", "ep", "etp"):
            if getattr(t, k) > 1:
                out.append(
                    error(
                        "torch-parallel",
                        f"trainer.{k}",
                        f'trainer.{k} = {getattr(t, k)} needs backend = "megatron"; the torch backend is '
                        "data parallel (FSDP2) only",
                    )
                )
    sp = t.ulysses_sequence_parallel_size
    if sp > 1 and t.backend == "megatron":
        out.append(error("ulysses-megatron", "trainer.ulysses_sequence_parallel_size",
                         f"ulysses_sequence_parallel_size = {sp} is the torch (FSDP2) backend's; megatron splits "
                         "sequences with trainer.cp", "set it to 1 and use trainer.cp, or backend = \"torch\""))
    elif sp > 1 and d.trainer_world % sp:
        out.append(error("ulysses-world", "trainer.ulysses_sequence_parallel_size",
                         f"ulysses_sequence_parallel_size = {sp} must divide the trainer's {d.trainer_world} ranks",
                         category="fit"))
    if t.backend == "torch" and t.recompute_granularity is not None:
        out.append(warn("recompute-backend", "trainer.recompute_granularity", "recompute_granularity is "
                        "Megatron's; the torch backend ignores it", "use trainer.enable_gradient_checkpointing"))
    if t.backend == "megatron" and t.enable_gradient_checkpointing:
        out.append(warn("checkpointing-backend", "trainer.enable_gradient_checkpointing", "enable_gradient_"
                        "checkpointing is the torch / FSDP2 backends'; Megatron ignores it",
                        'use trainer.recompute_granularity = "full" (or "selective")'))
    seqs = t.ppo_mini_batch_size * r.n
    if seqs % d.trainer_dp:
        out.append(
            error(
                "batch-dp",
                "trainer.ppo_mini_batch_size",
                f"ppo_mini_batch_size × rollout.n = {seqs} sequences do not split evenly over "
                f"{d.trainer_dp} data-parallel ranks",
            )
        )
    elif not t.use_dynamic_bsz and (seqs // d.trainer_dp) % t.ppo_micro_batch_size_per_gpu:
        out.append(
            error(
                "batch-micro",
                "trainer.ppo_micro_batch_size_per_gpu",
                f"ppo_micro_batch_size_per_gpu = {t.ppo_micro_batch_size_per_gpu} does not divide the "
                f"{seqs // d.trainer_dp} sequences each rank gets per mini-batch",
            )
        )
    out.extend(token_budget_rules(cfg))
    out.extend(megatron_key_backend_rules(cfg))
    if t.total_steps is not None and r.total_rollout_steps is not None:
        out.append(
            note(
                "total-steps-wins",
                "trainer.total_steps",
                "trainer.total_steps overrides the count derived from rollout.total_rollout_steps",
            )
        )
    if d.total_train_steps is None:
        out.append(
            warn(
                "total-steps-unknown",
                "trainer.total_steps",
                "cannot derive the number of steps: the training data is not available locally",
                "set trainer.total_steps or rollout.total_rollout_steps",
            )
        )
    elif d.total_train_steps == 0:
        out.append(
            error(
                "total-steps-zero",
                "rollout.total_rollout_steps",
                f"{d.total_rollout_steps} prompts are fewer than one policy version "
                f"({d.prompts_per_version} prompts): nothing would be trained",
            )
        )
    if d.total_local_steps and t.optim.warmup_steps > d.total_local_steps:
        out.append(
            warn(
                "warmup-too-long",
                "trainer.optim.warmup_steps",
                f"warm-up of {t.optim.warmup_steps} steps is longer than the run ({d.total_local_steps})",
            )
        )
    if not cfg.data.val_files and (t.test_freq > 0 or t.val_before_train):
        key = "trainer.test_freq" if t.test_freq > 0 else "trainer.val_before_train"
        out.append(warn("no-val-files", key, "validation is requested but data.val_files is empty"))
    if r.val_n > 1 and r.val_temperature == 0:
        out.append(error("val-n-greedy", "rollout.val_n",
                         f"val_n = {r.val_n} answers per prompt need sampling: greedy validation "
                         "(rollout.val_temperature = 0) gives the same answer n times; set val_temperature > 0 "
                         "(verl: val_kwargs.temperature)"))
    if r.backend == "hf":
        if r.tensor_parallel_size > 1:
            out.append(
                error(
                    "hf-tp",
                    "rollout.tensor_parallel_size",
                    'the hf rollout backend has no tensor parallelism; use backend = "vllm"',
                )
            )
        if prov.is_set("rollout.gpu_memory_utilization"):
            out.append(
                warn(
                    "hf-gpu-mem-noop",
                    "rollout.gpu_memory_utilization",
                    "gpu_memory_utilization is a vLLM setting; the hf backend ignores it",
                )
            )
    if "jsonl" not in cfg.logging.sinks:
        out.append(note("jsonl-always", "logging.sinks", "metrics.jsonl is always written"))
    return out


def token_budget_rules(cfg: RunConfig) -> list[Problem]:
    """`use_dynamic_bsz`: every budget holds the longest row (and what Megatron's pipeline with an all-gather MoE
    dispatcher pads)."""
    t = cfg.trainer
    if not t.use_dynamic_bsz:
        return []
    out = []
    if t.backend == "megatron" and t.pp > 1 and t.moe_token_dispatcher_type != "alltoall":
        out.append(warn("dynamic-bsz-megatron-pp-allgather", "trainer.use_dynamic_bsz",
                        "with pp > 1 a MoE model under Megatron's all-gather dispatcher (ep = 1, or CPU) sends every "
                        "micro-batch padded to one shape (the dispatcher takes no variable shapes): the token "
                        "budget then bounds the rows, not the padded tokens; dense models and the all-to-all "
                        "dispatcher send each micro-batch's own shape"))
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    sp = t.ulysses_sequence_parallel_size if t.backend == "torch" else 1  # an SP group's budget is × s (verl)
    for key, budget in (("ppo_max_token_len_per_gpu", t.ppo_max_token_len_per_gpu),
                        ("log_prob_max_token_len_per_gpu", t.log_prob_max_token_len_per_gpu)):
        if budget is not None and budget * sp < longest:
            out.append(error("token-budget-row", f"trainer.{key}",
                             f"{key} = {budget}{f' × ulysses {sp}' if sp > 1 else ''} is below the longest row, "
                             f"max_prompt_length + max_response_length = {longest}: raise it to at least "
                             f"{-(-longest // sp)}"))
    return out
