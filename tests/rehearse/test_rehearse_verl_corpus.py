"""verl's fully-async scripts (the importer's conformance corpus) rehearsed as imported: each script that converts
and names a model whose config.json ships with asyncrl (`asyncrl_cli/config/known_models`) is written by `asyncrl
import verl` and built at full scale on fake tensors by `asyncrl rehearse`.

Slow (minutes per script on 2 shared cores). The 235B script and the other 30B MoE ones are left out: a 235B
rehearsal did not finish within 15 min on 2 shared cores (tests/rehearse/test_rehearse.py, FRONTIER), and a
script that does not fit its hardware (the 235B one on 64 GB Ascend 910C) or that `validate` refuses is not
rehearsed (rehearse exits 1 on it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "cli" / "verl_corpus"
REHEARSED = {
    # script: hardware (as the corpus test imports it); model: Qwen2.5-Math-7B (known_models), FSDP2, Ulysses SP 4
    # from 16_16 on
    "dapo_7b_math_fsdp2_8_8": "h20",
    "dapo_7b_math_fsdp2_16_16": "h100",
    "dapo_7b_math_fsdp2_32_32": "h100",
    "dapo_7b_math_fsdp2_64_64": "h100",
    # verl's TensorRT-LLM scripts on their GB200 (4 × 186 GB per tray), run on vLLM as `--rollout-engine vllm`
    # asks; Megatron trainer with verl's flash attention: Qwen3-8B-Base (known_models) at TP 2 (about 1 min), and
    # Qwen3-30B-A3B-Base at TP 2 × EP 4 over 2 trays (about 2.5 min on 2 cores)
    "grpo_8b_base_math_megatron_4_4_trtllm": "gb200",
    "grpo_30b_a3b_base_math_megatron_8_8_mis_trtllm": "gb200",
}
OPTIONS = {name: ["--rollout-engine", "vllm"] for name in REHEARSED if name.endswith("_trtllm")}
"""What a user passes to convert the script (`asyncrl import verl --help`)."""


@pytest.mark.parametrize("name", sorted(REHEARSED))
def test_imported_verl_script_rehearses(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(app, ["import", "verl", str(CORPUS / f"{name}.sh"), "-o", "run.toml", "--hardware",
                            REHEARSED[name], *OPTIONS.get(name, [])])
    assert r.exit_code == 0, r.output
    start = time.perf_counter()
    r = runner.invoke(app, ["rehearse", "run.toml", "--json"])
    doc = json.loads(r.stdout)
    print(f"{name}: rehearsed in {time.perf_counter() - start:.0f} s")
    assert r.exit_code == 0, doc.get("failures")
    assert doc["ok"] and doc["ranks"] and all(rank["device_peak"] > 0 for rank in doc["ranks"])
