"""The TRL side-by-side study's shared recipe: the demo preset's GRPO settings expressed for TRL's
`GRPOTrainer`, and the reward adapter that scores TRL's completions with the project's own scorer.

Pure standard library plus `engine.data.rewards` (no torch, no TRL), so it imports in both venvs: the
study (project venv) builds the spec from the preset, the worker (`.venv-trl`) reads it back.

Mapping of the preset onto TRL (one TRL optimizer step = one asyncrl local step):

    prompts per step   P = trainer.ppo_mini_batch_size × async_training.require_batches
    num_generations    = rollout.n                                  (GRPO group size)
    per_device_train_batch_size = trainer.ppo_micro_batch_size_per_gpu     (sequences per micro-batch)
    gradient_accumulation_steps = P · n / micro                     (one optimizer step = P · n sequences)
    steps_per_generation = gradient_accumulation_steps · T          T = async_training.trigger_parameter_sync_step:
                         TRL generates T steps' sequences (generation_batch_size = T · P · n) with one policy
                         and trains T optimizer steps on them before it generates again — asyncrl's weight push
                         every T local steps (`mode = "sync"` is that exactly; fully async adds its staleness)
    max_steps          = trainer.total_steps · T when set (versions × steps per version), else
                         rollout.total_rollout_steps / P
    filter_groups      = algorithm.filter_groups.enable: recorded only — TRL's `GRPOTrainer` has no dynamic
                         sampling, so its steps keep the groups whose answers all scored alike
    max_completion_length = data.max_response_length
    learning_rate, adam_beta1/2, adam_epsilon, weight_decay, warmup_steps = trainer.optim.*
    lr_scheduler_type  = "constant"                                 (asyncrl keeps lr fixed after warm-up)
    max_grad_norm      = trainer.grad_clip
    epsilon / epsilon_high = trainer.clip_ratio_low / clip_ratio_high
    beta               = kl_loss_coef if use_kl_loss else 0
    loss_type          = "dapo" for token-mean (token-level mean over the whole step's batch)
    scale_rewards      = "group" if norm_adv_by_std_in_grpo else "none":  A = (r − mean_g) / (std_g + ε)
    temperature, top_p, top_k = rollout.*
    greedy validation  = data.val_max_samples prompts of the val split, every trainer.test_freq versions
                         (× async_training.trigger_parameter_sync_step steps),
                         before training when trainer.val_before_train, and at the end
"""

from __future__ import annotations

from typing import Any

TRAIN_EXTRA_SPLIT = "train"
VAL_EXTRA_SPLIT = "val"


_COPIED: dict[str, tuple[str, Any]] = {  # recipe key: (the preset's key, its type) — copied as they are
    "model_path": ("model.path", str),
    "dtype": ("model.dtype", str),
    "reward": ("data.reward", str),
    "train_files": ("data.train_files", list),
    "val_files": ("data.val_files", list),
    "data_seed": ("data.seed", int),
    "max_prompt_length": ("data.max_prompt_length", int),
    "max_completion_length": ("data.max_response_length", int),
    "val_max_samples": ("data.val_max_samples", lambda v: v),
    "learning_rate": ("trainer.optim.lr", float),
    "adam_epsilon": ("trainer.optim.eps", float),
    "weight_decay": ("trainer.optim.weight_decay", float),
    "warmup_steps": ("trainer.optim.warmup_steps", int),
    "max_grad_norm": ("trainer.grad_clip", float),
    "epsilon": ("trainer.clip_ratio_low", float),
    "epsilon_high": ("trainer.clip_ratio_high", float),
    "num_iterations": ("trainer.ppo_epochs", int),
    "temperature": ("rollout.temperature", float),
    "top_p": ("rollout.top_p", float),
    "top_k": ("rollout.top_k", int),
    "val_temperature": ("rollout.val_temperature", float),
    "test_freq": ("trainer.test_freq", int),
    "val_before_train": ("trainer.val_before_train", bool),
    "seed": ("trainer.seed", int),
}


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


class SpecError(ValueError):
    """The preset uses a setting the TRL side cannot reproduce."""


def recipe_from_config(cfg: Any) -> dict[str, Any]:
    """The TRL-facing recipe of a validated asyncrl `RunConfig` (or its `model_dump()` dict).

    Raises `SpecError` when the preset's batch does not split into whole TRL micro-batches, its step count is
    not whole (in steps, or in generations of `trigger_parameter_sync_step` steps), or its sync trigger cannot
    be mapped onto `steps_per_generation` (several mini-batches per local step; PPO epochs with T > 1):
    then no TRL run would do the same work."""
    prompts = int(_get(cfg, "trainer.ppo_mini_batch_size")) * int(_get(cfg, "async_training.require_batches"))
    n = int(_get(cfg, "rollout.n"))
    micro = int(_get(cfg, "trainer.ppo_micro_batch_size_per_gpu"))
    total_prompts = int(_get(cfg, "rollout.total_rollout_steps"))
    trigger = int(_get(cfg, "async_training.trigger_parameter_sync_step"))
    versions = _get(cfg, "trainer.total_steps")
    if (prompts * n) % micro:
        raise SpecError(f"{prompts} prompts × n={n} does not split into micro-batches of {micro}")
    if versions is None and total_prompts % prompts:
        raise SpecError(f"total_rollout_steps={total_prompts} is not a whole number of {prompts}-prompt steps")
    max_steps = int(versions) * trigger if versions is not None else total_prompts // prompts
    if max_steps * prompts > total_prompts:
        raise SpecError(f"trainer.total_steps={versions} needs {max_steps * prompts} prompts, "
                        f"total_rollout_steps={total_prompts} gives fewer")
    if int(_get(cfg, "async_training.require_batches")) != 1:
        raise SpecError("async_training.require_batches > 1: asyncrl takes one optimizer step per mini-batch, "
                        "this mapping one per local step; no TRL run here would do the same updates")
    if trigger > 1 and int(_get(cfg, "trainer.ppo_epochs")) > 1:
        raise SpecError(f"trigger_parameter_sync_step = {trigger} with ppo_epochs > 1: TRL's num_iterations "
                        "passes go over the whole generation batch (all T steps), asyncrl's over each local step")
    if max_steps % trigger:
        raise SpecError(f"{max_steps} steps are not a whole number of generations of "
                        f"trigger_parameter_sync_step = {trigger} steps")
    use_kl = bool(_get(cfg, "trainer.use_kl_loss"))
    agg = str(_get(cfg, "trainer.loss_agg_mode"))
    if agg != "token-mean":
        raise SpecError(f"loss_agg_mode={agg!r}: only token-mean has a TRL equivalent here (loss_type='dapo')")
    betas = list(_get(cfg, "trainer.optim.betas"))
    recipe = {name: cast(_get(cfg, key)) for name, (key, cast) in _COPIED.items()}
    recipe.update({
        "prompts_per_step": prompts,
        "num_generations": n,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": prompts * n // micro,
        "steps_per_generation": prompts * n // micro * trigger,
        "max_steps": max_steps,
        "filter_groups": bool(_get(cfg, "algorithm.filter_groups.enable")),
        "adam_beta1": float(betas[0]),
        "adam_beta2": float(betas[1]),
        "beta": float(_get(cfg, "trainer.kl_loss_coef")) if use_kl else 0.0,
        "loss_type": "dapo",
        "scale_rewards": "group" if bool(_get(cfg, "algorithm.norm_adv_by_std_in_grpo")) else "none",
        # asyncrl validates every test_freq policy versions; a version is trigger_parameter_sync_step steps
        "test_freq": int(_get(cfg, "trainer.test_freq")) * int(_get(cfg, "async_training.trigger_parameter_sync_step")),
    })
    return recipe


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
