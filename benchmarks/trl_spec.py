"""The TRL side-by-side study's shared recipe: the demo preset's GRPO settings expressed for TRL's
`GRPOTrainer`, and the reward adapter that scores TRL's completions with the project's own scorer.

Pure standard library plus `engine.data.rewards` (no torch, no TRL), so it imports in both venvs: the
study (project venv) builds the spec from the preset, the worker (`.venv-trl`) reads it back.

Mapping of the preset onto TRL (one TRL optimizer step = one asyncrl local step):

    prompts per step   P = trainer.ppo_mini_batch_size × async_training.require_batches
    num_generations    = rollout.n                                  (GRPO group size)
    per_device_train_batch_size = trainer.ppo_micro_batch_size_per_gpu     (sequences per micro-batch)
    gradient_accumulation_steps = P · n / micro                     (so generation_batch_size = P · n)
    max_steps          = rollout.total_rollout_steps / P
    max_completion_length = data.max_response_length
    learning_rate, adam_beta1/2, adam_epsilon, weight_decay, warmup_steps = trainer.optim.*
    lr_scheduler_type  = "constant"                                 (asyncrl keeps lr fixed after warm-up)
    max_grad_norm      = trainer.grad_clip
    epsilon / epsilon_high = trainer.clip_ratio_low / clip_ratio_high
    beta               = kl_loss_coef if use_kl_loss else 0
    loss_type          = "dapo" for token-mean (token-level mean over the whole step's batch)
    scale_rewards      = "group" if norm_adv_by_std_in_grpo else "none":  A = (r − mean_g) / (std_g + ε)
    temperature, top_p, top_k = rollout.*
    greedy validation  = data.val_max_samples prompts of the val split, every trainer.test_freq steps,
                         before training when trainer.val_before_train, and at the end
"""

from __future__ import annotations

from typing import Any

TRAIN_EXTRA_SPLIT = "train"
VAL_EXTRA_SPLIT = "val"


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


class SpecError(ValueError):
    """The preset uses a setting the TRL side cannot reproduce."""


def recipe_from_config(cfg: Any) -> dict[str, Any]:
    """The TRL-facing recipe of a validated asyncrl `RunConfig` (or its `model_dump()` dict).

    Raises `SpecError` when the preset's batch does not split into whole TRL micro-batches or its
    step count is not whole: then no TRL run would do the same work."""
    prompts = int(_get(cfg, "trainer.ppo_mini_batch_size")) * int(_get(cfg, "async_training.require_batches"))
    n = int(_get(cfg, "rollout.n"))
    micro = int(_get(cfg, "trainer.ppo_micro_batch_size_per_gpu"))
    total_prompts = int(_get(cfg, "rollout.total_rollout_steps"))
    if (prompts * n) % micro:
        raise SpecError(f"{prompts} prompts × n={n} does not split into micro-batches of {micro}")
    if total_prompts % prompts:
        raise SpecError(f"total_rollout_steps={total_prompts} is not a whole number of {prompts}-prompt steps")
    use_kl = bool(_get(cfg, "trainer.use_kl_loss"))
    agg = str(_get(cfg, "trainer.loss_agg_mode"))
    if agg != "token-mean":
        raise SpecError(f"loss_agg_mode={agg!r}: only token-mean has a TRL equivalent here (loss_type='dapo')")
    betas = list(_get(cfg, "trainer.optim.betas"))
    return {
        "model_path": str(_get(cfg, "model.path")),
        "dtype": str(_get(cfg, "model.dtype")),
        "reward": str(_get(cfg, "data.reward")),
        "train_files": list(_get(cfg, "data.train_files")),
        "val_files": list(_get(cfg, "data.val_files")),
        "data_seed": int(_get(cfg, "data.seed")),
        "max_prompt_length": int(_get(cfg, "data.max_prompt_length")),
        "max_completion_length": int(_get(cfg, "data.max_response_length")),
        "val_max_samples": _get(cfg, "data.val_max_samples"),
        "prompts_per_step": prompts,
        "num_generations": n,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": prompts * n // micro,
        "max_steps": total_prompts // prompts,
        "learning_rate": float(_get(cfg, "trainer.optim.lr")),
        "adam_beta1": float(betas[0]),
        "adam_beta2": float(betas[1]),
        "adam_epsilon": float(_get(cfg, "trainer.optim.eps")),
        "weight_decay": float(_get(cfg, "trainer.optim.weight_decay")),
        "warmup_steps": int(_get(cfg, "trainer.optim.warmup_steps")),
        "max_grad_norm": float(_get(cfg, "trainer.grad_clip")),
        "epsilon": float(_get(cfg, "trainer.clip_ratio_low")),
        "epsilon_high": float(_get(cfg, "trainer.clip_ratio_high")),
        "num_iterations": int(_get(cfg, "trainer.ppo_epochs")),
        "beta": float(_get(cfg, "trainer.kl_loss_coef")) if use_kl else 0.0,
        "loss_type": "dapo",
        "scale_rewards": "group" if bool(_get(cfg, "algorithm.norm_adv_by_std_in_grpo")) else "none",
        "temperature": float(_get(cfg, "rollout.temperature")),
        "top_p": float(_get(cfg, "rollout.top_p")),
        "top_k": int(_get(cfg, "rollout.top_k")),
        "val_temperature": float(_get(cfg, "rollout.val_temperature")),
        "test_freq": int(_get(cfg, "trainer.test_freq")),
        "val_before_train": bool(_get(cfg, "trainer.val_before_train")),
        "seed": int(_get(cfg, "trainer.seed")),
    }


def validation_steps(max_steps: int, test_freq: int, before_train: bool) -> list[int]:
    """The steps after which both sides validate: 0 (before training) if asked, every `test_freq`
    steps, and the last step (asyncrl always validates at the end)."""
    steps = [0] if before_train else []
    if test_freq > 0:
        steps += list(range(test_freq, max_steps + 1, test_freq))
    if max_steps not in steps:
        steps.append(max_steps)
    return steps


def make_reward_adapter(reward: str, eos_token_ids: list[int]) -> Any:
    """A TRL reward function (`fn(prompts, completions, completion_ids, **columns) -> list[float]`) that
    scores each completion exactly as asyncrl's `Scorer` does: the project's reward `reward` (by name and
    data_source, `engine.data.rewards.get_reward_fn`), called through `safe_score` on the decoded text
    with `extra_info = {"split", "index"}` of the row and `finished` = the completion ended with EOS.

    TRL decodes with `skip_special_tokens=True`, as the Scorer does; a completion given as chat messages
    is scored on its assistant content. The adapter also counts the generated tokens it saw
    (`adapter.generated_tokens`), EOS included, as asyncrl's response lengths count them."""
    from engine.data.rewards import get_reward_fn, safe_score

    eos = set(int(t) for t in eos_token_ids)
    fns: dict[str, Any] = {}

    def arith_reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                     **columns: Any) -> list[float]:
        scores = []
        n = len(completions)
        sources = columns.get("data_source") or [""] * n
        truths = columns["ground_truth"]
        splits = columns.get("split") or [TRAIN_EXTRA_SPLIT] * n
        indices = columns.get("index") or [0] * n
        for i, completion in enumerate(completions):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            ids = list(completion_ids[i])
            finished = bool(ids) and int(ids[-1]) in eos
            source = str(sources[i])
            if source not in fns:
                fns[source] = get_reward_fn(reward, source)
            score, _info, _error = safe_score(fns[source], text, str(truths[i]), data_source=source,
                                              extra_info={"split": splits[i], "index": int(indices[i])},
                                              finished=finished)
            scores.append(float(score))
            arith_reward.generated_tokens += len(ids)  # type: ignore[attr-defined]
        return scores

    arith_reward.generated_tokens = 0  # type: ignore[attr-defined]
    arith_reward.__name__ = f"asyncrl_{reward}"
    return arith_reward


def first_time_at(points: list[dict[str, Any]], threshold: float) -> float | None:
    """The wall time (s) of the first validation whose accuracy is ≥ `threshold`, None if none is."""
    for p in points:
        if p.get("acc") is not None and p.get("time_s") is not None and float(p["acc"]) >= threshold:
            return float(p["time_s"])
    return None
