"""verl Hydra overrides → asyncrl keys, as a contract: every override is accounted for.

The overrides are read from the `python -m verl…` command line (named blocks such as `$DATA_CONFIG` …
`$ASYNC_CONFIG` and arrays `"${arr[@]}"` expand into it), with the `n_gpus_rollout` / `n_gpus_training` /
`n_nodes_*` (and older `NNODES_*` / `NGPUS_PER_NODE`) variables as a fallback for the resource keys. Every
override lands in exactly one of three lists:

- mapped: the asyncrl key with the value verl would use (`MAP`; `REQUIRED` / `SAME_AS` values asyncrl honours
  without a key of its own are listed as ignored with their reason);
- ignored: no effect on the experiment (speed, memory placement, logging, paths), with the reason (`IGNORED`,
  `IGNORED_PREFIXES`);
- errors: the key changes the experiment and asyncrl cannot honour it (`REFUSED_PREFIXES`, a `REQUIRED` key with
  another value, a converter that refuses the value, a removed or unknown key). Any error stops the conversion
  (`asyncrl import verl` exits 1 and lists every one).

verl's defaults are filled where asyncrl's differ (`VERL_DEFAULTS`, and `data.image_key = "images"` for a
vision-language model). What the shell reader assumed (a positional default) is a note; what it could not
resolve (a bare `$1`, an unknown array) is an error, never dropped.

Two refusals the user can lift on the command line, each written into the file: verl's custom dataset class
(`data.custom_cls`, which cannot load without verl) is replaced by the user's plain-Python row adapter
(`--row-adapter file.py:fn` → `data.row_adapter`), and a TensorRT-LLM or SGLang rollout runs on vLLM
(`--rollout-engine vllm`, `engines`: what may differ is a warning). Multi-token prediction is one error line.

The tables are in `keys.py`, the value converters in `values.py`; this module applies them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from engine.config.rc_config import LEGACY_RS, invert_band
from asyncrl_cli.verl_import.keys import (  # noqa: F401 - MAP and the tables are this module's API too
    BASE_CONFIG_FACTS,
    BASE_CONFIGS,
    IGNORED,
    IGNORED_PREFIXES,
    LAYOUT_ONLY,
    MAP,
    REFUSED_PREFIXES,
    REMOVED,
    REQUIRED,
    RESOURCE_VARS,
    SAME_AS,
    VERL_DEFAULTS,
)
from asyncrl_cli.verl_import import engines
from asyncrl_cli.verl_import.shell import Script, concrete, parse_script
from asyncrl_cli.verl_import.values import (  # noqa: F401 - the converters are this module's API too
    AR,
    RC,
    ROLL,
    _unquote,
    to_bool,
    to_bool_safe,
    to_float,
    to_int,
    to_scalar,
    to_str,
    to_threshold,
)

@dataclass
class Conversion:
    """The result: asyncrl values by dotted key, the verl source of each, and every other override accounted
    for: ignored (no effect on the experiment, with the reason) or an error (the conversion stops)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What may differ from verl's run because the user asked for it (`--rollout-engine`): printed as warnings
    and written at the top of the file."""
    script: Script | None = None
    found_launch: bool = True
    """False when the script has no verl launch command and no `*_CONFIG` override block: nothing to convert."""


def _is_launch(cmd: list[str]) -> bool:
    """A `python -m verl…main` command line."""
    return any(w.endswith("fully_async_main") or "main_ppo" in w or (w.startswith("verl.") and "main" in w)
               for w in cmd)


def overrides_of(script: Script) -> tuple[list[str], list[str]]:
    """(Hydra overrides, --config-name values) of the verl launch command (or of the *_CONFIG blocks)."""
    for cmd in script.commands:
        if _is_launch(cmd):
            names = [w.split("=", 1)[1] for w in cmd if w.startswith("--config-name=")]
            return [w for w in cmd if "=" in w and not w.startswith("-")], names
    blocks = [v for k, v in script.variables.items() if k.endswith("_CONFIG")]
    return [w for b in blocks for w in b.split() if "=" in w], []


def _legacy_band(lower: str, upper: str) -> str | None:
    """The k1 spec of a legacy `_threshold_lower` / `_threshold` pair: the legacy modes bounded π_train/π_rollout,
    the k1 options bound π_rollout/π_train, so [lo, hi] becomes [1/hi, 1/lo] (`invert_band`)."""
    try:
        lo, hi = to_threshold(lower), to_threshold(upper)
    except ValueError:
        return None
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


def _classify(conv: Conversion, key: str, value: str, raw: dict[str, str]) -> None:
    """Put one override in exactly one list (see the module docstring)."""
    ov = f"{key}={value}"
    refused = next((why for pre, why in REFUSED_PREFIXES.items() if key.startswith(pre)), None)
    if refused is not None:
        conv.errors.append((ov, refused))
    elif key in MAP:
        target, fn = MAP[key]
        try:
            converted = fn(value)
        except ValueError as e:
            conv.errors.append((ov, str(e)))
            return
        if converted is None:
            conv.ignored.append((ov, "null: verl's default, which asyncrl's equals"))
            return
        if target in conv.values and conv.sources.get(target, "").partition("=")[0] in MAP:
            if conv.values[target] != converted:
                conv.errors.append((ov, f"conflicts with {conv.sources[target]}: asyncrl has one {target}"))
            else:
                conv.ignored.append((ov, f"the same {target} as {conv.sources[target]}"))
            return
        conv.values[target] = converted
        conv.sources[target] = ov
    elif key in REQUIRED:
        accepted, why = REQUIRED[key]
        if concrete(_unquote(value)).lower() in accepted:
            conv.ignored.append((ov, why))
        else:
            conv.errors.append((ov, f"only {' / '.join(accepted)}: {why}"))
    elif key in SAME_AS:
        other, why = SAME_AS[key]
        if _same(value, raw.get(other)):
            conv.ignored.append((ov, f"equals {other}: {why}"))
        else:
            conv.errors.append((ov, f"differs from {other}={raw.get(other)}: {why}"))
    elif key in LAYOUT_ONLY:
        other, why = LAYOUT_ONLY[key]
        conv.ignored.append((ov, f"equals {other}" if _same(value, raw.get(other)) else
                             f"differs from {other}={raw.get(other)}: {why}"))
    elif key in IGNORED:
        conv.ignored.append((ov, IGNORED[key]))
    elif any(key.startswith(pre) for pre in IGNORED_PREFIXES):
        conv.ignored.append((ov, next(why for pre, why in IGNORED_PREFIXES.items() if key.startswith(pre))))
    elif key in REMOVED:
        conv.errors.append((ov, REMOVED[key]))
    else:
        conv.errors.append((ov, "not known to asyncrl's importer: it may change the experiment"))


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b or (a is not None and _unquote(a) in ("null", "None"))
    x, y = concrete(_unquote(a)).lower(), concrete(_unquote(b)).lower()
    try:
        return float(x) == float(y)
    except ValueError:
        return x == y


def _special(conv: Conversion, raw: dict[str, str]) -> None:
    """Keys whose meaning depends on others: truncation, the custom reward function, validation sampling."""
    trunc = raw.pop("data.truncation", None)
    if trunc is not None:
        ov, mode = f"data.truncation={trunc}", concrete(_unquote(trunc))
        if to_bool_safe(raw.get("data.filter_overlong_prompts", "false")):
            conv.ignored.append((ov, "over-long prompts are filtered before truncation applies"))
        elif mode == "error":
            conv.ignored.append((ov, "asyncrl raises on an over-long prompt too (filter_overlong_prompts = false)"))
        elif mode in ("left", "right", "middle"):
            conv.ignored.append((ov, "asyncrl does not truncate: an over-long prompt stops the run (DataError) "
                                     "instead of being cut, so the run is verl's or fails loudly"))
        else:
            conv.errors.append((ov, f"unknown truncation {mode!r}"))
    for prefix in ("reward.custom_reward_function", "custom_reward_function"):
        path, name = raw.pop(f"{prefix}.path", None), raw.pop(f"{prefix}.name", None)
        if path is None and name is None:
            continue
        if path is None or _unquote(path) in ("null", "None", ""):
            conv.ignored.append((f"{prefix}.name={name}", "no custom reward path: the default reward"))
            continue
        fn = to_str(name) if name is not None else "compute_score"
        conv.values["data.reward"] = f"{to_str(path)}:{fn}"
        conv.sources["data.reward"] = f"{prefix}.path={path} {prefix}.name={name}"
    standalone = raw.pop(f"{ROLL}.standalone_gpu_memory_utilization", None)
    if standalone is not None and _unquote(standalone) not in ("null", "None"):
        try:
            conv.values["rollout.gpu_memory_utilization"] = to_float(standalone)
            conv.sources["rollout.gpu_memory_utilization"] = f"{ROLL}.standalone_gpu_memory_utilization={standalone}"
        except ValueError as e:
            conv.errors.append((f"{ROLL}.standalone_gpu_memory_utilization={standalone}", str(e)))
        shared = raw.pop(f"{ROLL}.gpu_memory_utilization", None)
        if shared is not None:
            conv.ignored.append((f"{ROLL}.gpu_memory_utilization={shared}", "for replicas sharing devices with the "
                                 "trainer; asyncrl's replicas are standalone"))
    elif standalone is not None:
        conv.ignored.append((f"{ROLL}.standalone_gpu_memory_utilization={standalone}",
                             "null: gpu_memory_utilization applies"))
    sample = raw.pop(f"{ROLL}.val_kwargs.do_sample", None)
    if sample is not None:
        conv.ignored.append((f"{ROLL}.val_kwargs.do_sample={sample}", IGNORED[f"{ROLL}.val_kwargs.do_sample"]))


PWD_FORMS = ("$(pwd)", "${PWD}", "$PWD")
NAME_KEYS = ("trainer.experiment_name", "trainer.project_name", "trainer.default_local_dir")
"""Keys that name the run or place its files: a value the shell reader cannot compute keeps asyncrl's default."""


def _resolve_pwd(conv: Conversion, raw: dict[str, str]) -> None:
    """`$(pwd)` / `$PWD` mean the directory the script runs from: the one `asyncrl import` runs from (noted)."""
    here = os.getcwd()
    hits = [key for key, value in raw.items() if any(form in value for form in PWD_FORMS)]
    for key in hits:
        for form in PWD_FORMS:
            raw[key] = raw[key].replace(form, here)
    if hits:
        conv.notes.append(f"$(pwd) resolved as {here}, the directory `asyncrl import` ran from "
                          f"({', '.join(sorted(hits))})")


def _drop_unrunnable_names(conv: Conversion, raw: dict[str, str]) -> None:
    """A run name or checkpoint directory built by a command (`$(date …)`, `$(basename …)`) keeps asyncrl's
    default (the run's name, its run directory) with a note: it names the run, it does not change it."""
    for key in NAME_KEYS:
        if "$(" in raw.get(key, ""):
            conv.ignored.append((f"{key}={raw.pop(key)}", "built by a shell command the reader does not run: "
                                 "asyncrl's default name / directory is used"))


SEQ_MODES = ("gspo", "geo_mean")
TC = "actor_rollout_ref.actor.megatron.override_transformer_config"


def _verl_semantics(conv: Conversion, raw: dict[str, str]) -> None:
    """What verl at 1dda039 does with two settings beyond their names, made the same experiment here or refused.

    * A sequence policy loss (gspo / geo_mean) in bypass mode (fully-async's default): verl's trainer swaps the
      loss mode to its bypass loss in *its own* config (`rollout_corr_helper.apply_bypass_mode`), which the
      actor workers, built before, never see: they run the script's loss against π_rollout with no rollout IS
      or rejection sampling (those run only in decoupled mode). asyncrl's bypass mode runs the same loss against
      π_rollout, IS weights as metrics only, but would apply `rollout_rs`: that combination is refused.
    * `moe_aux_loss_coeff` without `moe_router_load_balancing_type`: verl's Megatron engine sets the type to
      "none" (`workers/engine/megatron/transformer_impl.py`), so the coefficient has no effect; asyncrl runs
      the same (noted)."""
    mode, bypass = conv.values.get("trainer.loss_mode"), conv.values.get(f"{RC}.bypass_mode", True)
    if mode in SEQ_MODES and bypass:
        rs = conv.values.get(f"{RC}.rollout_rs")
        if rs is not None:
            conv.errors.append((conv.sources[f"{RC}.rollout_rs"], f"policy_loss.loss_mode={mode} in bypass mode: verl's "
                                "workers run it against the rollout log-probs without rejection sampling (the "
                                "trainer's switch to its bypass loss never reaches them); asyncrl would apply "
                                "rollout_rs. Set algorithm.rollout_correction.bypass_mode=False (decoupled) or "
                                "drop rollout_rs"))
        else:
            conv.notes.append(f"policy_loss.loss_mode={mode} in bypass mode runs as in verl 1dda039's workers: "
                              f"{mode} against the rollout log-probs (π_old = π_rollout), no IS weights in the loss")
    coeff = conv.values.get("trainer.moe_aux_loss_coeff", 0.0)
    if coeff and conv.values.get("trainer.moe_router_load_balancing_type", "none") == "none":
        conv.notes.append(f"{TC}.moe_aux_loss_coeff={coeff} has no effect, in verl as here: verl's Megatron engine "
                          "sets moe_router_load_balancing_type \"none\" unless the script sets it "
                          "(trainer.moe_router_load_balancing_type = \"none\"); moe_z_loss_coeff applies whatever the "
                          "type")


CT = "data.apply_chat_template_kwargs"


def _template_kwargs(conv: Conversion, raw: dict[str, str]) -> None:
    """`+data.apply_chat_template_kwargs.NAME=V` → `{ NAME = V }`: both pass them to every chat-template rendering."""
    for key in [k for k in raw if k.startswith(CT + ".")]:
        name, value = key.removeprefix(CT + "."), raw.pop(key)
        try:
            if "." in name:
                raise ValueError("a nested argument is not supported: give the whole value to one argument")
            conv.values.setdefault(CT, {})[name] = to_scalar(value)
            conv.sources[CT] = ", ".join(filter(None, (conv.sources.get(CT), f"{key}={value}")))
        except ValueError as e:
            conv.errors.append((f"{key}={value}", str(e)))


MTP = f"{AR}.model.mtp."


def _mtp(conv: Conversion, raw: dict[str, str]) -> None:
    """verl's multi-token prediction, as one line: refused when it trains the MTP heads (`enable_train`: their
    loss, `mtp_loss_scaling_factor` × the MTP cross-entropy, is added to the policy's) or decodes with them
    (`enable_rollout`: speculative decoding with the MTP heads as the draft, not in asyncrl's rollout); with both
    off (`enable` alone loads and saves the heads) the keys have no effect on the experiment."""
    keys = [k for k in raw if k.startswith(MTP)]
    if not keys:
        return
    on = {leaf: to_bool_safe(raw.get(MTP + leaf, "false")) for leaf in ("enable_train", "enable_rollout")}
    ovs = " ".join(f"{k}={raw.pop(k)}" for k in keys)
    parts = [why for leaf, why in (("enable_train", "training the MTP heads adds their loss to the policy loss "
                                    "(another objective)"),
                                   ("enable_rollout", "speculative decoding with the MTP heads is not in "
                                    "asyncrl's rollout")) if on[leaf]]
    if parts:
        conv.errors.append((ovs, f"multi-token prediction is not in asyncrl: {'; '.join(parts)}"))
    else:
        conv.ignored.append((ovs, "MTP heads loaded and saved only (enable_train and enable_rollout off): no "
                                  "effect on the experiment"))


CUSTOM_CLS = "data.custom_cls."


def _custom_cls(conv: Conversion, raw: dict[str, str], row_adapter: str | None) -> None:
    """verl's custom dataset class (`data.custom_cls.path` / `.name`) cannot be loaded without verl: refused, the
    message naming `--row-adapter`; with `row_adapter` (the user's plain-Python function that does the class's
    row transform), `data.row_adapter` replaces it, the file's comment naming the class."""
    keys = [k for k in raw if k.startswith(CUSTOM_CLS)]
    if row_adapter is not None:
        conv.values["data.row_adapter"] = row_adapter
        if keys:
            cls = to_str(raw.get(f"{CUSTOM_CLS}name", "?"))
            path = to_str(raw.get(f"{CUSTOM_CLS}path", "?"))
            conv.sources["data.row_adapter"] = f"--row-adapter, replacing verl's data.custom_cls {cls} ({path})"
            conv.ignored += [(f"{k}={raw.pop(k)}", f"replaced by data.row_adapter = {row_adapter!r} "
                                                   "(--row-adapter)") for k in keys]
        else:
            conv.sources["data.row_adapter"] = "--row-adapter"
            conv.notes.append(f"--row-adapter {row_adapter}: the script has no data.custom_cls; the adapter is "
                              "applied to every row as asked")
        return
    for k in keys:
        conv.errors.append((f"{k}={raw.pop(k)}", REFUSED_PREFIXES[CUSTOM_CLS]))


def convert_script(text: str, *, row_adapter: str | None = None, rollout_engine: str | None = None) -> Conversion:
    """Read a verl fully-async script and account for every override. `row_adapter` (`--row-adapter`, the
    user's `file.py:fn`) replaces verl's `data.custom_cls`; `rollout_engine` (`--rollout-engine vllm`, the user's
    consent) runs a TensorRT-LLM or SGLang script on vLLM (`engines`)."""
    script = parse_script(text)
    conv = Conversion(script=script)
    conv.notes += script.notes
    conv.errors += [(u, "the shell reader cannot resolve it") for u in script.unparsed]
    overrides, config_names = overrides_of(script)
    conv.found_launch = bool(overrides or config_names) or any(_is_launch(cmd) for cmd in script.commands)
    for cfg_name in config_names:
        stem = _unquote(cfg_name).removesuffix(".yaml")
        if stem in BASE_CONFIGS:
            conv.values["trainer.backend"] = BASE_CONFIGS[stem]
            conv.sources["trainer.backend"] = f"--config-name={cfg_name}"
            if stem in BASE_CONFIG_FACTS:
                conv.notes.append(BASE_CONFIG_FACTS[stem])
        else:
            conv.errors.append((f"--config-name={cfg_name}", "a base config whose defaults the importer does not "
                                f"know (it knows {', '.join(BASE_CONFIGS)})"))
    raw: dict[str, str] = {}
    for ov in overrides:
        key, _, value = ov.partition("=")
        key = key.lstrip("+~")
        if key in raw and not _same(raw[key], value):
            conv.errors.append((ov, f"set twice with different values ({raw[key]})"))
        raw[key] = value
    _resolve_pwd(conv, raw)
    _drop_unrunnable_names(conv, raw)
    unresolved = {key for key, value in raw.items() if "$(" in value}
    for key in unresolved:  # one error each; the value is not converted as well
        why = ("arithmetic the shell reader cannot evaluate" if "$((" in raw[key]
               else "a command substitution the shell reader does not run")
        conv.errors.append((f"{key}={raw[key]}", why))
    _legacy_rs(conv, raw)
    raw.pop(f"{RC}.rollout_rs", None)
    if to_bool_safe(raw.pop("async_training.compute_prox_log_prob", "false")):
        conv.values[f"{RC}.bypass_mode"] = False
        conv.sources[f"{RC}.bypass_mode"] = "async_training.compute_prox_log_prob=True"
        conv.notes.append("compute_prox_log_prob=True (removed in verl) → bypass_mode = false (decoupled)")
    _special(conv, raw)
    _mtp(conv, raw)
    _template_kwargs(conv, raw)
    _custom_cls(conv, raw, row_adapter)
    engine_kwargs = engines.take_engine_kwargs(raw)
    engine = engines.rollout_engine(conv, raw, rollout_engine)
    for key, value in raw.items():
        if key not in unresolved:
            _classify(conv, key, value, raw)
    engines.account(conv, engine_kwargs, engine, rollout_engine)
    _verl_semantics(conv, raw)
    if "algorithm.adv_estimator" not in raw:
        conv.errors.append(("algorithm.adv_estimator (unset)", "verl's default is gae (PPO with a critic); "
                            "asyncrl runs grpo: set it in the script"))
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
    if conv.values.get("trainer.backend") == "megatron" and "trainer.use_flash_attn" not in conv.values:
        conv.values["trainer.use_flash_attn"] = True
        conv.sources["trainer.use_flash_attn"] = "verl's default Megatron attention_backend: flash"
    if conv.values.get("trainer.backend", "torch") == "torch" and "trainer.enable_gradient_checkpointing" not in conv.values:
        conv.values["trainer.enable_gradient_checkpointing"] = True
        conv.sources["trainer.enable_gradient_checkpointing"] = "verl's default model.enable_gradient_checkpointing"
    model = str(conv.values.get("model.path", "")).lower()
    if "data.image_key" not in conv.values and "vl" in re.split(r"[^a-z0-9]+", model.replace("-vl", " vl ")):
        conv.values["data.image_key"] = "images"
        conv.sources["data.image_key"] = "verl's default image_key (a vision-language model)"
    return conv

