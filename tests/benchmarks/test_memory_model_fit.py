"""The memory-model study's algebra: on synthetic measurements that follow the model exactly, the fit recovers the
coefficients and predicts the held-out peaks exactly (the real measurements run in `python -m benchmarks
memory-model`, minutes per slice)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.memory_model as study

TRUE = {"c_h": 24.0, "c_i": 9.0, "c_m": 18.0, "c_ck": 6.0, "c_t": 0.5, "c_v": 12.0}


def _synthetic(spec: dict) -> dict:
    """Bytes a slice 'measures' when memory follows `engine.plan.memory` with TRUE coefficients."""
    from engine.plan.memory import activation_bytes, layer_params, transient_bytes

    if spec["kind"] == "head":
        return {"static": 0, "activation_peak": spec["tokens"] * spec["vocab"] * TRUE["c_v"], "params": 0,
                "seconds": 0.0}
    shape = study._Shape(spec)
    cal = {"coefficients": TRUE}
    tokens = max(len(mb) * max(mb) for mb in spec["micro_batches"])
    act = activation_bytes(shape, tokens, spec["layers"], bool(spec.get("recompute")), 2, cal)
    params = spec["layers"] * layer_params(shape)
    return {"static": 4 * params, "activation_peak": act + transient_bytes(shape, 2, cal), "params": params,
            "seconds": 0.0}


def test_the_fit_recovers_the_coefficients_and_predicts_the_held_out_peaks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(study, "measure", _synthetic)
    monkeypatch.setattr(study, "CALIBRATION_OUT", tmp_path / "activations.json")
    result = study.run("full", tmp_path)
    assert result["calibration"]["coefficients"] == pytest.approx(TRUE, rel=1e-6)
    assert json.loads((tmp_path / "activations.json").read_text())["coefficients"] == pytest.approx(TRUE, rel=1e-6)
    assert result["targets"][0]["status"] == "met" and result["targets"][0]["measured"] == pytest.approx(0, abs=0.1)
