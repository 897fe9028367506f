"""`asyncrl init` on real config.json files: the written preset validates and reports the right sizes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
HF = TESTS / "config" / "fixtures" / "hf"
KNOWN = TESTS.parent / "asyncrl_cli" / "config" / "known_models"
SHARED = Path("/work/shared/fixtures/hf-configs")


def _model_dir(tmp_path: Path, name: str, source: Path) -> Path:
    """A local model directory holding only config.json (what init reads)."""
    d = tmp_path / "models" / name
    d.mkdir(parents=True)
    d.joinpath("config.json").write_text(source.read_text())
    return d


CASES = [
    # (name, config source, dataset, hardware, gpus, published total, published active)
    ("Qwen3-30B-A3B-Base", KNOWN / "Qwen--Qwen3-30B-A3B-Base.json", "dapo-math", "h20", 128, 30.5e9, 3.3e9),
    (
        "Qwen3-VL-8B-Instruct",
        KNOWN / "Qwen--Qwen3-VL-8B-Instruct.json",
        "geo3k",
        "ascend-910b",
        32,
        8.8e9,
        8.8e9,
    ),
    ("Meta-Llama-3-8B", HF / "llama-3-8b" / "config.json", "gsm8k", "h100", 16, 8.03e9, 8.03e9),
    ("Qwen2.5-7B", HF / "qwen2.5-7b" / "config.json", "dapo-math", "a100", 16, 7.62e9, 7.62e9),
    ("Mixtral-8x7B-v0.1", HF / "mixtral-8x7b" / "config.json", "gsm8k", "h200", 64, 46.7e9, 12.9e9),
    ("Qwen3-0.6B", HF / "qwen3-0.6b" / "config.json", "copy", "cpu", 2, 0.6e9, 0.6e9),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_init_writes_a_preset_that_validates(cli, tmp_path: Path, case) -> None:
    name, source, dataset, hardware, gpus, total, active = case
    model = _model_dir(tmp_path, name, source)
    r = cli(
        "init",
        "--model",
        model,
        "--dataset",
        dataset,
        "--hardware",
        hardware,
        "--gpus",
        gpus,
        "-o",
        "run.toml",
    )
    assert r.exit_code == 0, r.output
    text = (tmp_path / "run.toml").read_text()
    assert text.startswith("#:schema ")
    assert "# Run:    asyncrl launch run.toml" in text
    data = tomllib.loads(text)
    res = data["resources"]
    used = sum(res[k]["nnodes"] * res[k]["gpus_per_node"] for k in ("trainer", "rollout"))
    assert used <= gpus
    v = cli("validate", "run.toml", "--json")
    assert v.exit_code == 0, v.output
    doc = json.loads(v.stdout)
    assert doc["model"]["params_total"] == pytest.approx(total, rel=0.02)
    assert doc["model"]["params_active"] == pytest.approx(active, rel=0.02)
    assert doc["memory"]["trainer"]["fits"] and doc["memory"]["rollout"]["fits"]


def test_init_on_the_shared_seed_configs(cli, tmp_path: Path) -> None:
    if not SHARED.is_dir():
        pytest.skip("shared fixtures not mounted")
    r = cli(
        "init",
        "--model",
        SHARED / "qwen3-30b-a3b-base",
        "--dataset",
        "dapo-math",
        "--hardware",
        "h20",
        "--gpus",
        128,
        "-o",
        "moe.toml",
    )
    assert r.exit_code == 0, r.output
    moe = tomllib.loads((tmp_path / "moe.toml").read_text())
    assert moe["trainer"]["backend"] == "megatron" and moe["trainer"]["ep"] == 8
    assert moe["resources"]["rollout"]["nnodes"] * 8 == 96  # the seed's 96 : 32 split
    r = cli(
        "init",
        "--model",
        SHARED / "qwen3-vl-8b-instruct",
        "--dataset",
        "geo3k",
        "--hardware",
        "ascend-910b",
        "--gpus",
        32,
        "-o",
        "vl.toml",
    )
    assert r.exit_code == 0, r.output
    assert tomllib.loads((tmp_path / "vl.toml").read_text())["trainer"]["backend"] == "torch"


def test_init_refuses_what_cannot_fit_and_missing_flags(cli, tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "moe", KNOWN / "Qwen--Qwen3-30B-A3B-Base.json")
    # one trainer GPU: 61 GB of bf16 weights and 122 GB of fp32 gradients, even with the optimizer offloaded
    r = cli(
        "init", "--model", model, "--dataset", "dapo-math", "--hardware", "h100", "--gpus", 2, "-o", "x.toml"
    )
    assert r.exit_code == 3 and "fits the trainer" in r.stderr
    r = cli("init", "--model", model)
    assert r.exit_code == 2 and "--dataset" in r.stderr
    r = cli("init", "--model", model, "--dataset", "nope", "--hardware", "h100")
    assert r.exit_code == 2 and "unknown dataset" in r.stderr
    r = cli("init", "--model", tmp_path / "no-such-model", "--dataset", "gsm8k", "--hardware", "h100")
    assert r.exit_code == 1 and "config.json" in r.stderr


def test_init_does_not_overwrite_without_force(cli, tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "small", HF / "qwen3-0.6b" / "config.json")
    (tmp_path / "run.toml").write_text("keep me")
    args = ("init", "--model", model, "--dataset", "copy", "--hardware", "cpu", "-o", "run.toml")
    assert cli(*args).exit_code == 2
    assert (tmp_path / "run.toml").read_text() == "keep me"
    assert cli(*args, "--force").exit_code == 0
