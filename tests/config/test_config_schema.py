"""Schema: forbidden extras, docstrings, verl's rollout-correction spec strings, knobs, JSON Schema sync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from asyncrl_cli.config.jsonschema import dumps, hardware_schema, run_schema
from engine.config.rc_config import parse_is_threshold, parse_rs_options, parse_rs_thresholds
from engine.config.rc_presets import RC_PRESETS
from asyncrl_cli.config.schema_paths import runtime_knobs
from engine.config.schema import RolloutCorrectionConfig, RunConfig, Section
from engine.control.knobs import KNOB_SPECS

PRESETS = Path(__file__).resolve().parents[2] / "presets"
BASE = {"model": {"path": "builtin:tiny-qwen"}, "data": {"train_files": ["builtin:copy"]}}


def test_every_field_has_a_description() -> None:
    def walk(model: type[Section], prefix: str) -> list[str]:
        missing = []
        for name, info in model.model_fields.items():
            if not info.description:
                missing.append(prefix + name)
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, Section):
                missing += walk(ann, f"{prefix}{name}.")
        return missing

    assert walk(RunConfig, "") == []


def test_unknown_keys_are_rejected() -> None:
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        RunConfig.model_validate({**BASE, "trainer": {"lrr": 1}})


@pytest.mark.parametrize(
    ("legacy", "canonical"), [("geometric", "seq_mean_k1"), ("sequence", "seq_sum_k1"), ("token", "token_k1")]
)
def test_legacy_rs_values_are_rejected_naming_the_replacement(legacy: str, canonical: str) -> None:
    with pytest.raises(ValidationError, match=canonical):
        RolloutCorrectionConfig(rollout_rs=legacy)


def test_rs_options_and_thresholds_follow_verl() -> None:
    def bounds(opts, spec):
        return [(th.lower, th.upper) for th in parse_rs_thresholds(opts, spec)]

    assert parse_rs_options("seq_mean_k1, token_k2,seq_mean_k1") == ["seq_mean_k1", "token_k2"]
    assert bounds(["seq_mean_k1"], "0.999_1.001") == [(0.999, 1.001)]
    assert bounds(["token_k1"], 2.0) == [(0.5, 2.0)]  # a single k1 bound u means [1/u, u]
    assert bounds(["seq_mean_k1", "seq_max_k3"], "0.9_1.1,0.01") == [(0.9, 1.1), (None, 0.01)]
    with pytest.raises(ValueError, match="upper bound only"):
        parse_rs_thresholds(["seq_mean_k3"], "0.1_0.2")
    with pytest.raises(ValueError, match="2 specs for 3"):
        parse_rs_thresholds(["token_k1", "token_k2", "token_k3"], "2.0,3.0")
    with pytest.raises(ValueError, match="u must be > 1"):
        parse_rs_thresholds(["token_k1"], 0.5)
    with pytest.raises(ValueError, match="unknown rollout_rs option"):
        parse_rs_options("seq_k1")
    assert parse_is_threshold(2.0) == (2.0, None)
    assert parse_is_threshold("0.5_5.0") == (5.0, 0.5)
    with pytest.raises(ValueError, match="0 < lower < upper"):
        parse_is_threshold("5.0_0.5")


@pytest.mark.parametrize("spec", ["inf", "nan", "0.5_inf", "nan_2.0"])
def test_non_finite_thresholds_are_refused_with_the_key(spec: str) -> None:
    with pytest.raises(ValidationError, match="rollout_is_threshold"):
        RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=spec)
    with pytest.raises(ValueError, match="rollout_rs_threshold for token_k1"):
        parse_rs_thresholds(["token_k1"], spec)


def test_every_rc_preset_validates() -> None:
    for name, keys in RC_PRESETS.items():
        RolloutCorrectionConfig.model_validate({**keys, "preset": name})


def test_runtime_knobs_are_the_knob_tables_fields_with_bounds() -> None:
    knobs = runtime_knobs()
    assert set(knobs) == {".".join(s.config_path) for s in KNOB_SPECS.values() if s.config_path}
    assert {"async_training.staleness_threshold", "async_training.trigger_parameter_sync_step"} <= set(knobs)
    assert "trainer.optim.lr" not in knobs and "model.path" not in knobs  # no live learning-rate knob
    assert knobs["async_training.staleness_threshold"].ge == 0
    assert knobs["async_training.trigger_parameter_sync_step"].gt == 0


def test_schema_marks_exactly_the_live_knobs_runtime_mutable() -> None:
    """Editors read `x-runtime-mutable` from the published schema: it must name what `ctl set` accepts, no more."""

    def marked(node: dict, path: tuple[str, ...] = ()) -> set[str]:
        out = {".".join(path)} if node.get("x-runtime-mutable") else set()
        for name, child in node.get("properties", {}).items():
            out |= marked(child, (*path, name))
        return out

    schema = json.loads((PRESETS / "asyncrl.schema.json").read_text(encoding="utf-8"))
    assert marked(schema) == set(runtime_knobs())
    for spec in KNOB_SPECS.values():  # the knob table and the schema agree on default and range
        if spec.config_path:
            node = schema
            for part in spec.config_path:
                node = node["properties"][part]
            assert node["default"] == spec.default, spec.name
            assert spec.low >= node.get("minimum", node.get("exclusiveMinimum", spec.low)), spec.name


def test_run_dir_default_and_name_pattern() -> None:
    assert RunConfig.model_validate(BASE).logging.run_dir == "runs/${name}"
    with pytest.raises(ValidationError, match="name"):
        RunConfig.model_validate({**BASE, "name": "bad name/x"})


def test_committed_json_schemas_are_in_sync() -> None:
    """`asyncrl schema --write` regenerates them; this fails when the models changed without it."""
    assert (PRESETS / "asyncrl.schema.json").read_text(encoding="utf-8") == dumps(run_schema())
    assert (PRESETS / "hardware.schema.json").read_text(encoding="utf-8") == dumps(hardware_schema())


def test_json_schema_is_flat_and_layer_friendly() -> None:
    text = dumps(run_schema())
    assert "$ref" not in text and '"required"' not in text
    s = run_schema()
    assert s["additionalProperties"] is False
    staleness = s["properties"]["async_training"]["properties"]["staleness_threshold"]
    assert staleness["x-runtime-mutable"] is True and staleness["description"]


def test_presets_carry_a_schema_header() -> None:
    for path in PRESETS.glob("*/*.toml"):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        expected = "hardware.schema.json" if path.parent.name == "hardware" else "asyncrl.schema.json"
        assert first == f"#:schema ../{expected}", path
