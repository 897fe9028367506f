"""One TRL `GRPOTrainer` run of the demo's recipe, inside `.venv-trl` (`make bench-trl-venv`).

    .venv-trl/bin/python -m benchmarks.trl_worker SPEC.json fp32|bf16

SPEC.json is written by `benchmarks/trl_grpo.py`: the recipe (`benchmarks.trl_spec.recipe_from_config`),
the converted SmolLM2 directory, and the train / validation prompts in asyncrl's order with the token ids
asyncrl's prompt renderer gave them (the worker checks TRL renders the same ids). Training runs on CPU
with `shuffle_dataset=False`, so TRL trains on asyncrl's prompt stream in asyncrl's (sync-mode) order.

Precision: `fp32` trains and generates in fp32; `bf16` is TRL's `bf16=True`: accelerate wraps the model's
`forward` in a CPU bf16 autocast over fp32 master weights, so sampling and greedy validation run in bf16 too.

Greedy validation (a callback): the validation prompts, greedy (`do_sample=False`), up to
`max_completion_length` new tokens, at the steps `trl_spec.validation_steps` names; accuracy = mean of the
project scorer's `acc` on validation rows. Clock: `time_s` counts from just before the model loads (after
the imports), as asyncrl's validation times count from the run's start, actor and model start-up included.

Last stdout line: one JSON object — per-step records (wall, generation time, generated tokens, reward),
validation points, totals and the derived rates:

    step_s          = wall of the step, validation excluded
    gen_tokens_per_s = Σ generated tokens (EOS included) ÷ Σ generation time     (sampling phase only)
    tokens_per_s    = Σ generated tokens ÷ Σ step_s                             (over the whole training)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.trl_spec import VAL_EXTRA_SPLIT, make_reward_adapter, validation_steps


def _greedy_accuracy(model: Any, tokenizer: Any, val: list[dict[str, Any]], spec: dict[str, Any],
                     reward: Any) -> tuple[float, float]:
    """(accuracy, mean response tokens) of one greedy pass over the validation prompts."""
    import torch

    from engine.data.rewards import get_reward_fn, safe_score

    was_training = model.training
    model.eval()
    ids = [row["prompt_ids"] for row in val]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    eos = reward.eos_token_ids
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=spec["max_completion_length"], eos_token_id=eos,
                             pad_token_id=pad, top_p=None, top_k=None, temperature=None)
    if was_training:
        model.train()
    accs, lengths = [], []
    for row, seq in zip(val, out[:, width:].tolist()):
        cut = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
        seq = seq[:cut]
        text = tokenizer.decode(seq, skip_special_tokens=True)
        fn = get_reward_fn(spec["reward"], row["data_source"])
        _, info, _ = safe_score(fn, text, row["ground_truth"], data_source=row["data_source"],
                                extra_info={"split": VAL_EXTRA_SPLIT, "index": row["index"]},
                                finished=bool(seq) and seq[-1] in eos)
        accs.append(float(info.get("acc", 0.0)))
        lengths.append(len(seq))
    return sum(accs) / len(accs), sum(lengths) / len(lengths)


def run(spec: dict[str, Any], precision: str) -> dict[str, Any]:
    imports_start = time.perf_counter()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    t0 = time.perf_counter()
    torch.manual_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    eos_ids = [int(tokenizer.eos_token_id)]
    reward = make_reward_adapter(spec["reward"], eos_ids)
    reward.eos_token_ids = eos_ids
    train, val = spec["train"], spec["val"]

    rendered = tokenizer.apply_chat_template([r["prompt"] for r in train[:8] + val[:8]],
                                             add_generation_prompt=True, tokenize=True, return_dict=True)
    same_ids = all(list(a) == r["prompt_ids"] for a, r in zip(rendered["input_ids"], train[:8] + val[:8]))

    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["ground_truth"],
                                  "data_source": r["data_source"], "split": r["split"], "index": r["index"]}
                                 for r in train])
    val_at = set(validation_steps(spec["max_steps"], spec["test_freq"], spec["val_before_train"]))
    steps: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    clock = {"step_start": None, "gen_s": 0.0, "tokens": 0, "val_s": 0.0}

    def validate(step: int, m: Any) -> None:
        start = time.perf_counter()
        acc, length = _greedy_accuracy(m, tokenizer, val, spec, reward)
        took = time.perf_counter() - start
        clock["val_s"] += took
        points.append({"step": step, "time_s": time.perf_counter() - t0, "acc": acc,
                       "mean_length": length, "val_s": took})
        print(f"[trl {precision}] val step {step}: acc {acc:.3f} at {points[-1]['time_s']:.0f}s", flush=True)

    class Timed(GRPOTrainer):
        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                clock["gen_s"] += time.perf_counter() - start

    class Record(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if 0 in val_at:
                validate(0, model)
            clock["step_start"] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if steps and logs and "reward" in logs:
                steps[-1]["reward"] = float(logs["reward"])
                steps[-1]["mean_length"] = float(logs.get("completions/mean_length", float("nan")))

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            now = time.perf_counter()
            steps.append({"step": state.global_step, "step_s": now - clock["step_start"],
                          "gen_s": clock["gen_s"], "tokens": reward.generated_tokens - clock["tokens"],
                          "time_s": now - t0})
            clock["gen_s"], clock["tokens"] = 0.0, reward.generated_tokens
            if state.global_step in val_at:
                validate(state.global_step, model)
            clock["step_start"] = time.perf_counter()

    out_dir = Path(spec["work_dir"]) / f"trl-{precision}"
    args = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=precision == "bf16", fp16=False,
        gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, seed=spec["seed"], data_seed=spec["seed"],
        shuffle_dataset=False, max_steps=spec["max_steps"],
        per_device_train_batch_size=spec["per_device_train_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        steps_per_generation=spec["steps_per_generation"],  # the asyncrl preset's sync trigger (trl_spec)
        num_generations=spec["num_generations"], max_completion_length=spec["max_completion_length"],
        learning_rate=spec["learning_rate"], lr_scheduler_type="constant", warmup_steps=spec["warmup_steps"],
        adam_beta1=spec["adam_beta1"], adam_beta2=spec["adam_beta2"], adam_epsilon=spec["adam_epsilon"],
        weight_decay=spec["weight_decay"], max_grad_norm=spec["max_grad_norm"],
        epsilon=spec["epsilon"], epsilon_high=spec["epsilon_high"], num_iterations=spec["num_iterations"],
        beta=spec["beta"], loss_type=spec["loss_type"], scale_rewards=spec["scale_rewards"],
        temperature=spec["temperature"], top_p=spec["top_p"], top_k=spec["top_k"],
    )
    trainer = Timed(model=model, reward_funcs=[reward], args=args, train_dataset=dataset,
                    processing_class=tokenizer, callbacks=[Record()])
    train_start = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - train_start
    if spec["max_steps"] in val_at and (not points or points[-1]["step"] != spec["max_steps"]):
        validate(spec["max_steps"], trainer.model)
    tokens = sum(s["tokens"] for s in steps)
    step_s = sum(s["step_s"] for s in steps)
    gen_s = sum(s["gen_s"] for s in steps)
    return {
        "label": f"trl-{precision}", "precision": precision, "prompt_ids_match": same_ids,
        "steps": steps, "validation": points, "train_wall_s": train_wall, "wall_s": time.perf_counter() - t0,
        "val_s": clock["val_s"], "step_s_total": step_s, "gen_s_total": gen_s, "generated_tokens": tokens,
        "gen_tokens_per_s": tokens / gen_s if gen_s else None, "tokens_per_s": tokens / step_s if step_s else None,
        "threads": torch.get_num_threads(), "import_s": t0 - imports_start,
        "versions": {p: _version(p) for p in ("trl", "transformers", "torch", "accelerate", "datasets")},
    }


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("fp32", "bf16"):
        print("usage: python -m benchmarks.trl_worker SPEC.json fp32|bf16", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(spec, argv[1])
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
