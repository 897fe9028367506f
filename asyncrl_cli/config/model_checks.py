"""Rules on what the config names: settings that must agree with the model's architecture (`model_rules`)
and model, tokenizer and data paths missing on this machine (`path_rules`). A missing model is a warning (a
cluster may have it, the hub may serve it); a missing dataset file is an error (`launch` reads the data here and
would stop), unless its path is an environment variable's default and that variable is unset here: a
placeholder for the cluster, a warning that names the variable. `checkpoint_disk_rules` warns when the checkpoint
directory's filesystem has less room than the run's checkpoints need.
"""

from __future__ import annotations

import os
from pathlib import Path

from asyncrl_cli.config.hf_model import VL_FAMILIES, ModelFacts, in_hub_cache
from asyncrl_cli.config.problems import Problem, error, note, warn
from asyncrl_cli.config.provenance import Provenance
from engine.config.schema import RunConfig
from engine.plan.sequence_parallel import ulysses_problem


def megatron_key_backend_rules(cfg: RunConfig) -> list[Problem]:
    """`engine.config.megatron_model`'s settings on the torch trainer (no model facts needed): the Megatron-only
    ones are ignored there (a warning), hidden dropout has no place there (an error)."""
    t = cfg.trainer
    out: list[Problem] = []
    if t.backend == "megatron":
        return out
    for key, value in (("num_layers_in_first_pipeline_stage", t.num_layers_in_first_pipeline_stage),
                       ("num_layers_in_last_pipeline_stage", t.num_layers_in_last_pipeline_stage),
                       ("moe_z_loss_coeff", t.moe_z_loss_coeff), ("moe_aux_loss_coeff", t.moe_aux_loss_coeff or None)):
        if value is not None:
            out.append(warn("megatron-only", f"trainer.{key}", f"{key} applies to the megatron backend only: the "
                            "torch trainer ignores it"))
    if t.hidden_dropout:
        out.append(error("hidden-dropout", "trainer.hidden_dropout", f"hidden_dropout = {t.hidden_dropout}: the HF "
                         "models the torch trainer runs have no dropout after their blocks",
                         "use the megatron backend, or 0"))
    return out


def megatron_model_rules(cfg: RunConfig, f: ModelFacts) -> list[Problem]:
    """`engine.config.megatron_model`'s settings against the model: the pipeline stages add up, the MoE losses
    have a router, a load-balancing coefficient has a load-balancing type, hidden dropout has a place."""
    from engine.config.megatron_model import stage_layers

    t = cfg.trainer
    out: list[Problem] = []
    uneven = (t.num_layers_in_first_pipeline_stage, t.num_layers_in_last_pipeline_stage)
    if t.backend != "megatron":
        return out
    if f.layers and (t.pp > 1 or any(n is not None for n in uneven)):
        try:
            stage_layers(f.layers, t.pp, *uneven)
        except ValueError as e:
            key = "trainer.pp" if not any(n is not None for n in uneven) else \
                "trainer.num_layers_in_first_pipeline_stage"
            out.append(error("pp-layers", key, f"{e} ({f.layers} layers)",
                             "choose a pp that divides the layer count, or first / last stage sizes that leave the "
                             "middle stages an equal share"))
    if not f.is_moe and (t.moe_z_loss_coeff is not None or t.moe_aux_loss_coeff > 0):
        out.append(warn("moe-loss-dense", "trainer.moe_aux_loss_coeff", f"{f.model_type} has no router: the MoE "
                        "auxiliary losses have no effect"))
    if f.is_moe and t.moe_aux_loss_coeff > 0 and t.moe_router_load_balancing_type == "none":
        out.append(note("moe-aux-off", "trainer.moe_aux_loss_coeff", f"moe_aux_loss_coeff = {t.moe_aux_loss_coeff} "
                        "has no effect with moe_router_load_balancing_type = \"none\" (verl's setting: its Megatron "
                        "engine runs the same way)"))
    return out


def model_rules(cfg: RunConfig, f: ModelFacts) -> list[Problem]:
    """Settings that must agree with the architecture."""
    t, r = cfg.trainer, cfg.rollout
    out: list[Problem] = []
    if t.backend == "megatron" and t.ep > 1:
        if not f.is_moe:
            out.append(error("ep-dense", "trainer.ep", f"ep = {t.ep} but {f.model_type} has no experts"))
        elif f.experts % t.ep:
            out.append(error("ep-experts", "trainer.ep", f"ep = {t.ep} does not divide the {f.experts} experts"))
    if t.backend == "megatron" and t.etp > 1 and not f.is_moe:
        out.append(warn("etp-dense", "trainer.etp", f"etp = {t.etp} has no effect: {f.model_type} has no experts"))
    if t.backend == "megatron" and (f.heads % t.tp or f.kv_heads % t.tp):
        out.append(
            error(
                "tp-heads",
                "trainer.tp",
                f"tp = {t.tp} does not split {f.heads} attention / {f.kv_heads} KV heads: Megatron needs both "
                "divisible by tp (it does not replicate KV heads)",
            )
        )
    sp = t.ulysses_sequence_parallel_size
    if t.backend == "torch" and sp > 1 and f.heads and ulysses_problem(sp, sp, f.heads, f.kv_heads or f.heads):
        out.append(error("ulysses-heads", "trainer.ulysses_sequence_parallel_size",
                         str(ulysses_problem(sp, sp, f.heads, f.kv_heads or f.heads))))
    out += megatron_model_rules(cfg, f)
    tp = r.tensor_parallel_size
    if f.heads % tp or (f.kv_heads % tp and tp % f.kv_heads):
        out.append(
            error(
                "rollout-tp-heads",
                "rollout.tensor_parallel_size",
                f"tensor_parallel_size = {tp} does not split {f.heads} attention / {f.kv_heads} KV heads",
            )
        )
    total_len = cfg.data.max_prompt_length + cfg.data.max_response_length
    if f.max_position_embeddings and total_len > f.max_position_embeddings:
        out.append(
            warn(
                "context-too-long",
                "data.max_response_length",
                f"max_prompt_length + max_response_length = {total_len} exceeds the model's "
                f"max_position_embeddings = {f.max_position_embeddings}",
                "raise max_position_embeddings in the model's config.json (as verl's DAPO recipe does)",
            )
        )
    is_vl = f.model_type in VL_FAMILIES
    if is_vl and cfg.data.image_key is None:
        out.append(
            warn(
                "vl-no-images",
                "data.image_key",
                f"{f.model_type} is multimodal but data.image_key is not set: images will not be fed",
            )
        )
    if not is_vl and cfg.data.image_key is not None:
        out.append(
            warn(
                "images-text-model",
                "data.image_key",
                f"data.image_key is set but {f.model_type} is a text-only model",
            )
        )
    return out


def _env_hint(prov: Provenance, key: str) -> str | None:
    names = [v for v in prov.get(key).env_vars if v not in ("HOME", "USER", "PWD")]
    if not names:
        return None
    states = [f"{n} (set to {os.environ[n]!r})" if n in os.environ else f"{n} (unset)" for n in names]
    return "override with the environment variable " + " or ".join(states)


def _looks_local(p: str) -> bool:
    return p.startswith(("/", ".", "~")) or p.count("/") != 1 or os.sep == "\\" and "\\" in p


def _exists(p: str, base_dir: Path | None) -> bool:
    path = Path(os.path.expanduser(p))
    return path.exists() or (base_dir is not None and not path.is_absolute() and (base_dir / path).exists())


def path_rules(cfg: RunConfig, prov: Provenance, base_dir: Path | None) -> list[Problem]:
    """Model, tokenizer and data paths that do not exist here (see the module docstring for which are errors)."""
    out: list[Problem] = []
    for key, value in (("model.path", cfg.model.path), ("model.tokenizer_path", cfg.model.tokenizer_path)):
        if value is None or value.startswith("builtin:") or "${" in value or _exists(value, base_dir):
            continue
        if _looks_local(value):
            out.append(warn("path-not-found", key, f"not found: {value}", _env_hint(prov, key)))
        elif key == "model.path" and not in_hub_cache(value):
            out.append(
                note(
                    "hub-not-cached",
                    key,
                    f"{value} is not in the local Hugging Face cache; "
                    "its weights must be downloaded before launch",
                    _env_hint(prov, key),
                )
            )
    for key in ("data.train_files", "data.val_files"):
        files = getattr(cfg.data, key.split(".")[1])
        missing = [
            f for f in files if not f.startswith("builtin:") and "${" not in f and not _exists(f, base_dir)
        ]
        if not missing:
            continue
        env = [v for v in prov.get(key).env_vars if v not in ("HOME", "USER", "PWD")]
        if env and not any(v in os.environ for v in env):
            out.append(warn("path-not-found", key, f"not found here: {', '.join(missing)} (launch here would stop)",
                            _env_hint(prov, key)))
        else:
            out.append(error("data-not-found", key, f"no such file: {', '.join(missing)}", _env_hint(prov, key)))
    return out


def checkpoint_disk_rules(cfg: RunConfig, f: ModelFacts, run_dir_base: Path | None = None) -> list[Problem]:
    """A warning when the filesystem of the checkpoint directory has less free space than the run's checkpoints
    need: (keep_last + 1) × one checkpoint (`engine.plan.memory.checkpoint_bytes`)."""
    import shutil

    from engine.plan.memory import checkpoint_bytes

    root = Path(os.path.expanduser(cfg.checkpoint.dir or str(Path(cfg.logging.run_dir) / "checkpoints")))
    if "${" in str(root):
        return []
    root = (run_dir_base or Path.cwd()) / root if not root.is_absolute() else root
    where = next((p for p in (root, *root.parents) if p.exists()), None)
    if where is None:
        return []
    one = checkpoint_bytes(cfg, f)
    need, free = (cfg.checkpoint.keep_last + 1) * one, shutil.disk_usage(where).free
    if free >= need:
        return []
    key = "checkpoint.dir" if cfg.checkpoint.dir else "checkpoint.keep_last"
    return [warn("checkpoint-disk", key, f"checkpoints need about {_gb(need)} ((keep_last + 1) × {_gb(one)}) but "
                 f"{where} has {_gb(free)} free: a save would fail for lack of space",
                 "free space, lower checkpoint.keep_last, or set checkpoint.dir on a larger disk")]


def _gb(n: float) -> str:
    return f"{n / 1e9:,.0f} GB" if n >= 100e9 else f"{n / 1e9:.3g} GB"
