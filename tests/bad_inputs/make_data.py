"""Regenerate the binary files of the bad-input corpus (`data/`): parquet datasets, verl scripts that are not text, a tiny model whose
config.json does not match its weights, and checkpoint directories for the resume cases.

    .venv/bin/python tests/bad_inputs/make_data.py

Deterministic; the text files of the corpus (cases/*.toml, data/config, data/rewards, ...) are written by
hand and not touched here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
REPO = HERE.parents[1]


def _row(content: object, truth: object = "123", source: str = "asyncrl/copy") -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": content}],
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": 0}}


def write_parquets() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = DATA / "parquet"
    out.mkdir(parents=True, exist_ok=True)
    good = [_row(f"copy {n}=", str(n)) for n in (123, 456, 789, 321)]
    overlong = _row("copy " + "9" * 200 + "=", "9" * 200)
    empty = _row("", "")
    tables = {
        "empty_prompt.parquet": [*good, empty],
        "overlong_prompt.parquet": [*good, overlong],
        "all_overlong.parquet": [overlong, overlong],
        "bad_rows_mixed.parquet": [*good, *good, empty, overlong],
        "unknown_source.parquet": [_row(f"copy {n}=", str(n), source="my-lab/secret-task") for n in (1, 2)],
    }
    for name, rows in tables.items():
        pq.write_table(pa.Table.from_pylist(rows), out / name)
    pq.write_table(pa.Table.from_pylist([{"question": "copy 1=", "reward_model": {"ground_truth": "1"}}]),
                   out / "missing_prompt_column.parquet")
    pq.write_table(pa.Table.from_pylist([{"data_source": "asyncrl/copy", "prompt": 42,
                                          "reward_model": {"ground_truth": "1"}}]),
                   out / "prompt_wrong_type.parquet")
    pq.write_table(pa.Table.from_pylist([{"data_source": "asyncrl/copy",
                                          "prompt": [{"role": "user", "content": "copy 1="}],
                                          "reward_model": {"style": "rule"}}]),
                   out / "no_ground_truth.parquet")
    (out / "not_parquet.parquet").write_text("prompt,reward\ncopy 1=,1\n")


def write_mismatched_model() -> None:
    """Weights of a 1-layer Qwen2 with hidden size 8, and a config.json that says 16."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = {"vocab_size": 64, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
           "tie_word_embeddings": True}
    model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg))
    out = DATA / "models" / "mismatch"
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = Qwen2Config(**{**cfg, "hidden_size": 16, "intermediate_size": 32}).to_dict()
    config["architectures"] = ["Qwen2ForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_checkpoint(root: Path, step: int, state: dict, corrupt: bool) -> None:
    """A checkpoint directory in the format of engine.persist.checkpoint (the trainer files are stand-ins:
    the resume checks refuse these checkpoints before anything would load them)."""
    ckpt = root / f"global_step_{step}"
    shutil.rmtree(ckpt, ignore_errors=True)
    (ckpt / "trainer").mkdir(parents=True)
    (ckpt / "trainer" / "model.safetensors").write_bytes(b"stand-in weights\n")
    (ckpt / "state.json").write_text(json.dumps({"format": 1, **state}))
    (ckpt / "queued.json").write_text("[]")
    (ckpt / "in_flight.json").write_text("[]")
    files = {}
    for f in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        data = f.read_bytes()
        files[str(f.relative_to(ckpt))] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if corrupt:
        files["trainer/model.safetensors"]["bytes"] += 1000  # as if the file had been truncated
    (ckpt / "manifest.json").write_text(json.dumps({"format": 1, "step": step, "files": files}))


def write_runs() -> None:
    sys.path.insert(0, str(REPO))
    from asyncrl_cli.config import load_run_config
    from engine.persist.resume import config_fingerprint

    cfg = load_run_config(REPO / "presets" / "runs" / "tiny-cpu.toml", []).config
    fingerprint = config_fingerprint(cfg)
    state = {"step": 2, "version": 2, "since_sync": 0, "reason": "periodic", "ledger_bytes": 0,
             "fingerprint": fingerprint}
    runs = DATA / "run_dirs"
    _write_checkpoint(runs / "corrupt" / "checkpoints", 2, state, corrupt=True)
    _write_checkpoint(runs / "other_group_size" / "checkpoints", 2,
                      {**state, "fingerprint": {**fingerprint, "rollout.n": 99}}, corrupt=False)
    never = runs / "never_checkpointed"
    never.mkdir(parents=True, exist_ok=True)
    (never / "ledger.jsonl").write_text(json.dumps({"uid": "0:1", "status": "trained", "step": 1, "version": 1,
                                                    "time": 0.0}) + "\n")


def write_verl_scripts() -> None:
    """The verl scripts of the importer cases that are not text: Latin-1 bytes in a launch line, and a binary."""
    out = DATA / "verl_scripts"
    out.mkdir(parents=True, exist_ok=True)
    launch = "python3 -m verl.experimental.fully_async_policy.fully_async_main algorithm.adv_estimator=grpo"
    (out / "not_utf8.sh").write_bytes(f"{launch} trainer.experiment_name=caf".encode() + b"\xe9\n")
    (out / "binary.sh").write_bytes(bytes(range(256)) * 4)


if __name__ == "__main__":
    write_verl_scripts()
    write_parquets()
    write_mismatched_model()
    write_runs()
    print(f"wrote {DATA}")
