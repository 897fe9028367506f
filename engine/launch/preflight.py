"""Checks the driver runs before it touches the run directory or starts Ray.

A bad model directory or a bad dataset is the user's to fix, so it must end as one line and exit code 1
from `asyncrl launch`, not as an actor failure minutes later (and never leave a half-made run directory).
Checked here:

* the model directory resolves, has a `config.json` that builds a model, and weight files; when they are
  safetensors, every tensor's shape is compared with the model the config describes (read from the file
  headers and a meta-device model, so no weights are loaded); prompt + response lengths fit its context;
* the tokenizer loads;
* the training (and validation) data load and render: readable parquet, the required columns, a reward
  function that resolves for every `data_source`, empty / over-long prompts filtered or rejected as
  `data.filter_overlong_prompts` says, and at least one prompt left;
* with multi-turn rollouts, that the tool sandbox (bubblewrap) can be built here, unless
  `rollout.multi_turn.allow_unsandboxed`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")


class PreflightError(ValueError):
    """An input problem found before the run starts (one line)."""


def preflight(cfg: RunConfig) -> str:
    """The resolved model directory, after checking the model and the data; raises PreflightError."""
    from engine.models.loader import load_tokenizer, resolve_model_path

    try:
        model_dir = resolve_model_path(cfg.model.path, seed=cfg.trainer.seed)
    except (FileNotFoundError, ValueError, ImportError, OSError) as e:
        raise PreflightError(f"model.path: {e}") from None
    check_model_dir(model_dir, trust_remote_code=cfg.model.trust_remote_code)
    check_lengths(cfg, model_dir)
    try:
        tokenizer = load_tokenizer(model_dir, trust_remote_code=cfg.model.trust_remote_code)
    except (ValueError, OSError) as e:
        raise PreflightError(f"model.path: {e}") from None
    check_data(cfg, tokenizer)
    check_tool_sandbox(cfg)
    return str(model_dir)


def check_tool_sandbox(cfg: RunConfig) -> None:
    """Multi-turn tools refuse to run without their sandbox: say so before the run starts."""
    mt = cfg.rollout.multi_turn
    if mt.enable and not mt.allow_unsandboxed:
        from engine.agent.box import unavailable_reason
        from engine.agent.tools import run_tools

        try:
            needs_box = run_tools(mt).needs_box()
        except (OSError, ValueError):
            needs_box = True  # validate reports the tools' own problem
        reason = unavailable_reason() if needs_box else None
        if reason is not None:
            raise PreflightError(f"rollout.multi_turn: tools refuse to run: {reason}")


def check_model_dir(model_dir: Path, trust_remote_code: bool = False) -> None:
    """config.json builds a model, weight files exist, and safetensors shapes match the config."""
    if not (model_dir / "config.json").is_file():
        raise PreflightError(f"model.path: {model_dir} has no config.json, so it is not a Hugging Face model "
                             "directory")
    read_config(model_dir)
    if not any(any(model_dir.glob(g)) for g in WEIGHT_GLOBS):
        raise PreflightError(f"model.path: {model_dir} has a config.json but no weights (expected "
                             "model.safetensors or pytorch_model.bin)")
    expected = _expected_shapes(model_dir, trust_remote_code)
    found = _safetensors_shapes(model_dir)
    if found is None:
        return  # .bin weights: checked when the replicas load them
    problems = _compare(expected, found)
    if problems:
        raise PreflightError(f"model.path: {model_dir}: config.json does not match the weights: {problems}")


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json as a dict (PreflightError when it is not a JSON object)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise PreflightError(f"model.path: {model_dir}/config.json is not valid JSON ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:120]})") from None
    if not isinstance(config, dict):
        raise PreflightError(f"model.path: {model_dir}/config.json is not a JSON object")
    return config


def check_lengths(cfg: RunConfig, model_dir: Path) -> None:
    """max_prompt_length + max_response_length must fit the model's context (`max_position_embeddings`)."""
    config = read_config(model_dir)
    context = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    total = cfg.data.max_prompt_length + cfg.data.max_response_length
    if isinstance(context, int) and total > context:
        raise PreflightError(
            f"data.max_prompt_length + data.max_response_length = {total} tokens exceed the model's context "
            f"(max_position_embeddings = {context})")


def _expected_shapes(model_dir: Path, trust_remote_code: bool) -> dict[str, Any]:
    """{"shapes": name → shape, "tied": groups of names sharing one tensor} of the config's model."""
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from engine.models.loader import auto_model_class

    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = auto_model_class(config).from_config(config, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad config
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise PreflightError(f"model.path: {model_dir}: invalid config.json ({type(e).__name__}: {first})") from None
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    return {"shapes": shapes, "tied": list(groups.values())}


def _safetensors_shapes(model_dir: Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor name → shape from the safetensors headers (None when the weights are not safetensors)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with f.open("rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
        except (OSError, ValueError) as e:
            raise PreflightError(f"model.path: {f} is not a readable safetensors file ({type(e).__name__})") from None
        for name, meta in header.items():
            if name != "__metadata__":
                out[name] = tuple(meta["shape"])
    return out


def _compare(expected: dict[str, Any], found: dict[str, tuple[int, ...]]) -> str:
    """Mismatched shapes and missing tensors, when the file's names are the model's (else no verdict)."""
    shapes: dict[str, tuple[int, ...]] = expected["shapes"]
    if sum(1 for k in found if k in shapes) < len(found) / 2:
        return ""  # another naming scheme (e.g. without the `model.` prefix): the loader maps it
    wrong = [f"{k} {found[k]} in the weights vs {shapes[k]} in the config" for k in sorted(found)
             if k in shapes and found[k] != shapes[k]]
    missing = [g[0] for g in expected["tied"] if not any(n in found for n in g)]
    parts = []
    if wrong:
        parts.append(f"{len(wrong)} tensor(s) of another shape (e.g. {wrong[0]})")
    if missing:
        parts.append(f"{len(missing)} tensor(s) missing (e.g. {missing[0]})")
    return "; ".join(parts)


def check_data(cfg: RunConfig, tokenizer: Any) -> None:
    """Training and validation prompts load, render and are not all filtered out."""
    from engine.data.prompts import load_prompts

    for split, files in (("train", cfg.data.train_files), ("val", cfg.data.val_files)):
        if not files:
            continue
        key = f"data.{split}_files"
        try:
            prompts, counters = load_prompts(cfg.data, tokenizer, split=split, epoch=0)
        except (ValueError, OSError, ImportError) as e:  # DataError is a ValueError
            raise PreflightError(f"{key}: {_one_line(e)}") from None
        if not prompts:
            raise PreflightError(
                f"{key}: no prompt left: {counters['rows']} row(s), {counters['filtered_empty']} empty and "
                f"{counters['filtered_overlong']} longer than data.max_prompt_length = {cfg.data.max_prompt_length}")


def _one_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
