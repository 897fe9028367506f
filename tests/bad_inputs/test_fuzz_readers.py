"""Fuzzing the two readers of foreign files: the verl script importer and verl's tool-config reader.

Whatever bytes or values they are given — random bytes, a real script or tool config cut anywhere, random
YAML/TOML values in any place — they either convert or end with the user-facing error they document (a
Conversion with errors / an InvalidConfig for the importer, a ValueError for the tool config), which the CLI
prints as one line. Any other exception would reach the user as "internal error, please report it".
Bounded: a few hundred examples each, a few seconds in all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl_cli.commands.import_ import read_script
from asyncrl_cli.errors import InvalidConfig
from asyncrl_cli.verl_import.convert import MAP, convert_script
from engine.agent.tools import from_verl_yaml

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[1] / "tests" / "cli" / "verl_corpus"
SCRIPTS = sorted(CORPUS.glob("*.sh"))
GOOD_TOOLS = (
    "tools:\n"
    "  - class_name: recipe.retool.retool.CustomSandboxFusionTool\n"
    "    config: {sandbox_fusion_url: 'http://x/run_code', default_timeout: 30, memory_limit_mb: 1024}\n"
    "    tool_schema:\n"
    "      type: function\n"
    "      function:\n"
    "        name: code_interpreter\n"
    "        description: A tool for executing code.\n"
    "        parameters: {type: object, properties: {code: {type: string}}, required: [code]}\n"
).encode()
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Values as YAML/TOML/JSON can spell them: scalars of every type (with the awkward floats), nested lists/maps.
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3)
                      | st.dictionaries(st.text(max_size=10), kids, max_size=3), max_leaves=8)
shell_values = (st.integers().map(str) | st.floats().map(repr) | st.text(max_size=20)
                | st.sampled_from(["1e999", "-1e999", "nan", "inf", "$((1/0))", "$((7 % 0))", "${X:-", "$(",
                                   "'", '"', "\\", "${a[@]}", "$1", "[1,2", "null", "True", "0x10", ""]))


def _import(data: bytes, tmp_path: Path) -> None:
    """What `asyncrl import verl` does before writing: read the file, convert it (its errors are the report)."""
    script = tmp_path / "script.sh"
    script.write_bytes(data)
    try:
        conv = convert_script(read_script(script))
    except InvalidConfig:
        return
    assert all(isinstance(ov, str) and isinstance(why, str) for ov, why in conv.errors)


def _tools(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_bytes(data)
    try:
        reg = from_verl_yaml(path)
    except ValueError as e:
        assert "\n" not in str(e), str(e)  # one line
        return
    for tool in reg.tools.values():
        assert tool.limits.timeout_s > 0 and tool.limits.memory_mb > 0


@FUZZ
@given(data=st.binary(max_size=400))
def test_the_importer_survives_random_bytes(data: bytes, tmp_path: Path) -> None:
    _import(data, tmp_path)


@pytest.mark.skipif(not SCRIPTS, reason="no verl corpus")
@FUZZ
@given(which=st.integers(0, 1000), cut=st.floats(0, 1), junk=st.binary(max_size=8))
def test_the_importer_survives_a_real_script_cut_anywhere(which: int, cut: float, junk: bytes, tmp_path) -> None:
    text = SCRIPTS[which % len(SCRIPTS)].read_bytes()
    _import(text[: int(len(text) * cut)] + junk, tmp_path)


@FUZZ
@given(overrides=st.lists(st.tuples(st.sampled_from(sorted(MAP)), shell_values), max_size=6))
def test_the_importer_survives_any_value_for_any_key(overrides: list[tuple[str, str]], tmp_path) -> None:
    line = " ".join(f"{k}='{v}'" if "'" not in v else f"{k}={v}" for k, v in overrides)
    _import(f"python3 -m verl.experimental.fully_async_policy.fully_async_main {line}\n".encode(), tmp_path)


@FUZZ
@given(data=st.binary(max_size=400))
def test_the_tool_config_reader_survives_random_bytes(data: bytes, tmp_path: Path) -> None:
    _tools(data, tmp_path)


@FUZZ
@given(cut=st.floats(0, 1), junk=st.binary(max_size=8))
def test_the_tool_config_reader_survives_a_config_cut_anywhere(cut: float, junk: bytes, tmp_path: Path) -> None:
    _tools(GOOD_TOOLS[: int(len(GOOD_TOOLS) * cut)] + junk, tmp_path)


@FUZZ
@given(doc=values, where=st.sampled_from(["root", "tools", "entry", "config", "default_timeout", "memory_limit_mb",
                                          "tool_schema", "function", "parameters", "required", "name"]))
def test_the_tool_config_reader_survives_any_value_anywhere(doc: object, where: str, tmp_path: Path) -> None:
    good = yaml.safe_load(GOOD_TOOLS)
    entry = good["tools"][0]
    fn = entry["tool_schema"]["function"]
    place = {"root": lambda: doc, "tools": lambda: {"tools": doc}, "entry": lambda: {"tools": [doc]}}
    if where in place:
        good = place[where]()
    elif where in ("default_timeout", "memory_limit_mb"):
        entry["config"][where] = doc
    elif where in ("config", "tool_schema"):
        entry[where] = doc
    elif where == "function":
        entry["tool_schema"]["function"] = doc
    elif where == "required":
        fn["parameters"]["required"] = doc
    else:
        fn[where] = doc
    # JSON is YAML; floats such as nan/inf are written as YAML's .nan/.inf
    text = yaml.safe_dump(good) if _yaml_safe(good) else json.dumps(good, allow_nan=False, default=str)
    _tools(text.encode(), tmp_path)


def _yaml_safe(doc: object) -> bool:
    try:
        yaml.safe_dump(doc)
        return True
    except yaml.YAMLError:
        return False


@FUZZ
@given(key=st.sampled_from(["tools", "title", "tools.config"]), value=values)
def test_the_tool_config_reader_survives_toml_documents(key: str, value: object, tmp_path: Path) -> None:
    """A TOML file given as the tool config (`key = value` and a table; JSON's literals are TOML's)."""
    literal = json.dumps(value, default=str).replace("NaN", "nan").replace("Infinity", "inf")
    _tools(f"{key} = {literal}\n[tools.x]\nclass_name = 'SandboxFusionTool'\n".encode(), tmp_path)
