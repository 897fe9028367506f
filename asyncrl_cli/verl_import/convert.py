"""verl Hydra overrides → asyncrl keys.

The overrides are read from the `python -m verl…` command line (named blocks such as `$DATA_CONFIG` …
`$ASYNC_CONFIG` expand into it), with the `n_gpus_rollout` / `n_gpus_training` / `n_nodes_*` (and older
`NNODES_*` / `NGPUS_PER_NODE`) variables as a fallback for the resource keys. Every override lands in one
of three lists: mapped (with the asyncrl key), consumed (verl requires that value in fully-async mode, or
it has no asyncrl counterpart by design; listed with the reason), and unmapped (reported to the user).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl_cli.config.rc_options import LEGACY_RS, invert_band
from asyncrl_cli.verl_import.shell import Script, concrete, parse_script

AR = "actor_rollout_ref"
ACTOR = f"{AR}.actor"
ROLL = f"{AR}.rollout"
RC = "algorithm.rollout_correction"


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def to_bool(v: str) -> bool:
    """Hydra booleans."""
    s = concrete(_unquote(v)).lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def to_int(v: str) -> int:
    """Hydra ints (symbolic env defaults use their default)."""
    return int(float(concrete(_unquote(v))))


def to_float(v: str) -> float:
    """Hydra floats."""
    return float(concrete(_unquote(v)))


def to_str(v: str) -> str:
    """A string, keeping `${ENV:-default}` overrides."""
    return _unquote(v)


def to_list(v: str) -> list[str]:
    """`['a','b']`, `[a,b]` or a single value → list of strings."""
    s = _unquote(v)
    if s.startswith("[") and s.endswith("]"):
        return [_unquote(x) for x in s[1:-1].split(",") if x.strip()]
    return [s]


def to_threshold(v: str) -> float | str:
    """A float, or a `"lower_upper"` spec kept as a string."""
    s = _unquote(concrete(v)) if "$" in v else _unquote(v)
    try:
        return float(s)
    except ValueError:
        return s


def to_top_k(v: str) -> int:
    """verl's −1 (off, vLLM) → asyncrl's 0 (off)."""
    return max(0, to_int(v))


def to_sinks(v: str) -> list[str]:
    """`trainer.logger` → sinks (jsonl always first; unknown loggers dropped)."""
    known = ("console", "tensorboard", "wandb")
    return ["jsonl", *[x for x in to_list(v) if x in known]]


def to_every(v: str) -> int:
    """`save_freq` (−1 = never) → `every_versions` (0 = only at the end)."""
    return max(0, to_int(v))


def to_backend(v: str) -> str:
    """fsdp/fsdp2 → torch, megatron → megatron."""
    s = to_str(v)
    if s in ("fsdp", "fsdp2"):
        return "torch"
    if s == "megatron":
        return "megatron"
    raise ValueError(f"no asyncrl trainer backend for strategy {s!r}")


def to_rollout_backend(v: str) -> str:
    """vllm → vllm (sglang/trtllm have no asyncrl backend)."""
    s = to_str(v)
    if s != "vllm":
        raise ValueError(f"no asyncrl rollout backend for {s!r} (vllm or hf)")
    return s


def to_optional(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """`null` → None (the key is left out)."""

    def inner(v: str) -> Any:
        return None if _unquote(v) in ("null", "None", "~") else conv(v)

    return inner


MAP: dict[str, tuple[str, Callable[[str], Any]]] = {
    "data.train_files": ("data.train_files", to_list),
    "data.val_files": ("data.val_files", to_list),
    "data.max_prompt_length": ("data.max_prompt_length", to_int),
    "data.max_response_length": ("data.max_response_length", to_int),
    "data.prompt_key": ("data.prompt_key", to_str),
    "data.image_key": ("data.image_key", to_str),
    "data.filter_overlong_prompts": ("data.filter_overlong_prompts", to_bool),
    "data.shuffle": ("data.shuffle", to_bool),
    "data.seed": ("data.seed", to_int),
    f"{AR}.model.path": ("model.path", to_str),
    f"{AR}.model.trust_remote_code": ("model.trust_remote_code", to_bool),
    f"{ACTOR}.strategy": ("trainer.backend", to_backend),
    f"{ACTOR}.fsdp_config.strategy": ("trainer.backend", to_backend),
    f"{ACTOR}.megatron.tensor_model_parallel_size": ("trainer.tp", to_int),
    f"{ACTOR}.megatron.pipeline_model_parallel_size": ("trainer.pp", to_int),
    f"{ACTOR}.megatron.context_parallel_size": ("trainer.cp", to_int),
    f"{ACTOR}.megatron.expert_model_parallel_size": ("trainer.ep", to_int),
    f"{ACTOR}.optim.lr": ("trainer.optim.lr", to_float),
    f"{ACTOR}.optim.lr_warmup_steps": ("trainer.optim.warmup_steps", to_int),
    f"{ACTOR}.optim.weight_decay": ("trainer.optim.weight_decay", to_float),
    f"{ACTOR}.optim.betas": ("trainer.optim.betas", lambda v: [float(x) for x in to_list(v)]),
    f"{ACTOR}.grad_clip": ("trainer.grad_clip", to_float),
    f"{ACTOR}.ppo_mini_batch_size": ("trainer.ppo_mini_batch_size", to_int),
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": ("trainer.ppo_micro_batch_size_per_gpu", to_int),
    f"{ACTOR}.ppo_epochs": ("trainer.ppo_epochs", to_int),
    f"{ACTOR}.shuffle": ("trainer.shuffle", to_bool),
    f"{ACTOR}.clip_ratio_low": ("trainer.clip_ratio_low", to_float),
    f"{ACTOR}.clip_ratio_high": ("trainer.clip_ratio_high", to_float),
    f"{ACTOR}.clip_ratio_c": ("trainer.clip_ratio_c", to_float),
    f"{ACTOR}.loss_agg_mode": ("trainer.loss_agg_mode", to_str),
    f"{ACTOR}.use_kl_loss": ("trainer.use_kl_loss", to_bool),
    f"{ACTOR}.kl_loss_coef": ("trainer.kl_loss_coef", to_float),
    f"{ACTOR}.kl_loss_type": ("trainer.kl_loss_type", to_str),
    f"{ACTOR}.entropy_coeff": ("trainer.entropy_coeff", to_float),
    f"{ROLL}.name": ("rollout.backend", to_rollout_backend),
    f"{ROLL}.n": ("rollout.n", to_int),
    f"{ROLL}.temperature": ("rollout.temperature", to_float),
    f"{ROLL}.top_p": ("rollout.top_p", to_float),
    f"{ROLL}.top_k": ("rollout.top_k", to_top_k),
    f"{ROLL}.tensor_model_parallel_size": ("rollout.tensor_parallel_size", to_int),
    f"{ROLL}.gpu_memory_utilization": ("rollout.gpu_memory_utilization", to_float),
    f"{ROLL}.max_num_seqs": ("rollout.max_num_seqs", to_int),
    f"{ROLL}.val_kwargs.temperature": ("rollout.val_temperature", to_float),
    "algorithm.adv_estimator": ("algorithm.adv_estimator", to_str),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.norm_adv_by_std_in_grpo", to_bool),
    f"{RC}.rollout_is": (f"{RC}.rollout_is", to_optional(to_str)),
    f"{RC}.rollout_is_threshold": (f"{RC}.rollout_is_threshold", to_threshold),
    f"{RC}.rollout_is_batch_normalize": (f"{RC}.rollout_is_batch_normalize", to_bool),
    f"{RC}.rollout_rs_threshold": (f"{RC}.rollout_rs_threshold", to_optional(to_threshold)),
    f"{RC}.bypass_mode": (f"{RC}.bypass_mode", to_bool),
    f"{RC}.loss_type": (f"{RC}.loss_type", to_str),
    "trainer.nnodes": ("resources.trainer.nnodes", to_int),
    "trainer.n_gpus_per_node": ("resources.trainer.gpus_per_node", to_int),
    "rollout.nnodes": ("resources.rollout.nnodes", to_int),
    "rollout.n_gpus_per_node": ("resources.rollout.gpus_per_node", to_int),
    "rollout.total_rollout_steps": ("rollout.total_rollout_steps", to_int),
    "trainer.total_epochs": ("trainer.total_epochs", to_int),
    "rollout.total_epochs": ("trainer.total_epochs", to_int),
    "trainer.total_training_steps": ("trainer.total_steps", to_optional(to_int)),
    "trainer.test_freq": ("trainer.test_freq", lambda v: max(0, to_int(v))),
    "rollout.test_freq": ("trainer.test_freq", lambda v: max(0, to_int(v))),
    "trainer.val_before_train": ("trainer.val_before_train", to_bool),
    "trainer.save_freq": ("checkpoint.every_versions", to_every),
    "trainer.default_local_dir": ("checkpoint.dir", to_str),
    "trainer.project_name": ("logging.project", to_str),
    "trainer.experiment_name": ("name", to_str),
    "trainer.logger": ("logging.sinks", to_sinks),
    "trainer.seed": ("trainer.seed", to_int),
    "async_training.staleness_threshold": ("async_training.staleness_threshold", to_float),
    "async_training.trigger_parameter_sync_step": ("async_training.trigger_parameter_sync_step", to_int),
    "async_training.require_batches": ("async_training.require_batches", to_int),
    "async_training.partial_rollout": ("async_training.partial_rollout", to_bool),
}
"""verl key → (asyncrl key, converter)."""

CONSUMED: dict[str, str] = {
    "data.train_batch_size": "unused in fully async (verl asserts 0)",
    "data.gen_batch_size": "prompts stream one at a time (verl asserts 1)",
    "data.return_raw_chat": "asyncrl always keeps the chat messages",
    f"{ROLL}.mode": "asyncrl's rollout is always asynchronous",
    f"{ROLL}.calculate_log_probs": "rollout log-probs are always returned",
    f"{AR}.hybrid_engine": "trainer and rollout pools are always separate",
    f"{ACTOR}.use_rollout_log_probs": "bypass_mode decides which log-probs act as π_old",
    "async_training.use_rollout_log_probs": "removed in verl; bypass_mode decides",
    "trainer.resume_mode": "use `asyncrl launch --resume auto|PATH`",
    "critic.strategy": "GRPO has no critic",
    "trainer.critic_warmup": "GRPO has no critic",
    "algorithm.use_kl_in_reward": "only the KL loss is supported (trainer.use_kl_loss)",
    "algorithm.kl_ctrl.kl_coef": "only the KL loss is supported (trainer.kl_loss_coef)",
    f"{ACTOR}.megatron.expert_tensor_parallel_size": "asyncrl uses expert tensor parallel 1",
    f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size": "no virtual pipeline stages",
}
"""verl keys that need no asyncrl key, with the reason (reported as notes, not as failures)."""

REMOVED: dict[str, str] = {
    f"{RC}.rollout_token_veto_threshold": "removed in verl (#4544): there is no veto any more",
    f"{RC}.rollout_rs_threshold_lower": 'removed in verl: k1 thresholds are one "lower_upper" spec',
    f"{RC}.bypass_old_logprob_for_rollout": "removed in verl: use bypass_mode",
    f"{RC}.use_pure_rollout_correction": "removed in verl: use bypass_mode + loss_type",
}
"""Keys verl removed: reported as not mapped, with the reason."""

VERL_DEFAULTS: dict[str, tuple[Any, str]] = {
    "rollout.backend": ("vllm", "verl's default rollout engine"),
    "model.dtype": ("bfloat16", "verl trains and serves in bf16"),
}
"""Values verl uses when the script says nothing, where asyncrl's own default differs."""

RESOURCE_VARS: dict[str, tuple[str, ...]] = {
    "n_gpus_rollout": ("resources.rollout.gpus_per_node",),
    "n_gpus_training": ("resources.trainer.gpus_per_node",),
    "n_nodes_rollout": ("resources.rollout.nnodes",),
    "n_nodes_train": ("resources.trainer.nnodes",),
    "NNODES_ROLLOUT": ("resources.rollout.nnodes",),
    "NNODES_TRAIN": ("resources.trainer.nnodes",),
    "NGPUS_PER_NODE": ("resources.rollout.gpus_per_node", "resources.trainer.gpus_per_node"),
}
"""Shell variables that carry the resources when the overrides do not."""


@dataclass
class Conversion:
    """The result: asyncrl values by dotted key, the verl source of each, and what was left over."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    consumed: list[tuple[str, str]] = field(default_factory=list)
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    script: Script | None = None


def overrides_of(script: Script) -> tuple[list[str], list[str]]:
    """(Hydra overrides, --config-name values) of the verl launch command (or of the *_CONFIG blocks)."""
    for cmd in script.commands:
        if any(
            w.endswith("fully_async_main") or "main_ppo" in w or (w.startswith("verl.") and "main" in w)
            for w in cmd
        ):
            names = [w.split("=", 1)[1] for w in cmd if w.startswith("--config-name=")]
            return [w for w in cmd if "=" in w and not w.startswith("-")], names
    blocks = [v for k, v in script.variables.items() if k.endswith("_CONFIG")]
    return [w for b in blocks for w in b.split() if "=" in w], []


def _legacy_band(lower: str, upper: str) -> str | None:
    """The k1 spec of a legacy `_threshold_lower` / `_threshold` pair: the legacy modes bounded π_train/π_rollout,
    the k1 options bound π_rollout/π_train, so [lo, hi] becomes [1/hi, 1/lo] (`invert_band`)."""
    lo, hi = to_threshold(lower), to_threshold(upper)
    if not isinstance(lo, float) or not isinstance(hi, float) or not 0 < lo < hi:
        return None
    new_lo, new_hi = invert_band(lo, hi)
    return f"{new_lo:.12g}_{new_hi:.12g}"


def _legacy_rs(conv: Conversion, raw: dict[str, str]) -> None:
    """verl's pre-#4544 `rollout_rs=token|sequence|geometric` + `_threshold` + `_threshold_lower` → the canonical
    k1 option with the band inverted (see `_legacy_band`)."""
    rs = raw.get(f"{RC}.rollout_rs")
    if rs is None:
        return
    val = _unquote(rs)
    if val in ("null", "None"):
        conv.sources[f"{RC}.rollout_rs"] = f"{RC}.rollout_rs={rs}"
        return
    if val in LEGACY_RS:
        new = LEGACY_RS[val]
        conv.values[f"{RC}.rollout_rs"] = new
        lower = raw.pop(f"{RC}.rollout_rs_threshold_lower", None)
        upper = raw.get(f"{RC}.rollout_rs_threshold")
        spec = _legacy_band(lower, upper) if upper is not None and lower is not None else None
        if spec is not None:
            conv.values[f"{RC}.rollout_rs_threshold"] = spec
            raw.pop(f"{RC}.rollout_rs_threshold")
            conv.sources[f"{RC}.rollout_rs_threshold"] = "legacy rollout_rs_threshold(_lower), inverted"
            conv.notes.append(f"legacy rollout_rs={val!r} converted to {new!r} with the band inverted to {spec} "
                              f"(the legacy mode bounded π_train/π_rollout, {new} bounds π_rollout/π_train)")
        else:
            conv.notes.append(f"legacy rollout_rs={val!r} converted to {new!r} (verl removed the old values)")
    else:
        conv.values[f"{RC}.rollout_rs"] = val
    conv.sources[f"{RC}.rollout_rs"] = f"{RC}.rollout_rs={rs}"


def convert_script(text: str) -> Conversion:
    """Read a verl fully-async script and map its overrides."""
    script = parse_script(text)
    conv = Conversion(script=script)
    overrides, config_names = overrides_of(script)
    if any("megatron" in n for n in config_names):
        conv.values["trainer.backend"] = "megatron"
        conv.sources["trainer.backend"] = f"--config-name={config_names[0]}"
    raw: dict[str, str] = {}
    for ov in overrides:
        key, _, value = ov.partition("=")
        raw[key.lstrip("+~")] = value
    _legacy_rs(conv, raw)
    raw.pop(f"{RC}.rollout_rs", None)
    if to_bool_safe(raw.pop("async_training.compute_prox_log_prob", "false")):
        conv.values[f"{RC}.bypass_mode"] = False
        conv.sources[f"{RC}.bypass_mode"] = "async_training.compute_prox_log_prob=True"
        conv.notes.append("compute_prox_log_prob=True (removed in verl) → bypass_mode = false (decoupled)")
    for key, value in raw.items():
        if key in MAP:
            target, fn = MAP[key]
            try:
                converted = fn(value)
            except ValueError as e:
                conv.unmapped.append((f"{key}={value}", str(e)))
                continue
            if converted is None:
                continue
            conv.values[target] = converted
            conv.sources[target] = f"{key}={value}"
        elif key in CONSUMED:
            conv.consumed.append((f"{key}={value}", CONSUMED[key]))
        else:
            conv.unmapped.append((f"{key}={value}", REMOVED.get(key, "no asyncrl counterpart")))
    for var, targets in RESOURCE_VARS.items():
        if var not in script.variables:
            continue
        for target in targets:
            if target not in conv.values:
                try:
                    conv.values[target] = to_int(script.variables[var])
                    conv.sources[target] = f"shell variable {var}={script.variables[var]}"
                except ValueError:
                    pass
    for target, (value, why) in VERL_DEFAULTS.items():
        if target not in conv.values:
            conv.values[target] = value
            conv.sources[target] = why
    return conv


def to_bool_safe(v: str) -> bool:
    """A boolean, or False when the value is not one."""
    try:
        return to_bool(v)
    except ValueError:
        return False
