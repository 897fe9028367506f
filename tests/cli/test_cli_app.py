"""The app shell: help, version, presets, schema, data, optional commands, error mapping, import cost."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from asyncrl_cli import app as app_module
from asyncrl_cli import version as version_module
from asyncrl_cli.config.jsonschema import run_schema

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "vllm", "transformers")


def test_help_lists_the_commands_in_panels(cli) -> None:
    r = cli("--help")
    assert r.exit_code == 0
    for word in (
        "Run lifecycle",
        "Inspect",
        "init",
        "validate",
        "launch",
        "presets",
        "schema",
        "import",
        "data",
    ):
        assert word in r.stdout
    assert cli().exit_code == 2  # no arguments: help, as a usage error


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(cli, flag: str) -> None:
    r = cli(flag)
    assert r.exit_code == 0 and r.stdout == f"asyncrl {metadata.version('asyncrl')}\n"


def test_version_of_a_source_tree_that_is_not_installed_is_pyprojects(monkeypatch, tmp_path: Path) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version_module, "version", not_installed)
    assert version_module.package_version() == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version_module.package_version(tmp_path / "missing.toml") == "unknown"


def test_version_flag_answers_without_building_the_cli() -> None:
    """`asyncrl -V` as the console script runs it: one line, exit 0, before the config schema or anything heavy
    is imported (the answer must be instant)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "asyncrl_cli", "-V"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == f"asyncrl {metadata.version('asyncrl')}\n"
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert not {m.split(".")[0] for m in imported} & {*HEAVY, "pydantic"}
    assert "asyncrl_cli.config.schema" not in imported


def test_presets_list_and_show(cli) -> None:
    r = cli("presets", "list", "--json")
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    refs = {(x["kind"], x["name"]) for x in rows}
    assert {
        ("hardware", "h100"),
        ("hardware", "ascend-910c"),
        ("runs", "tiny-cpu"),
        ("models", "smollm2"),
        ("datasets", "geo3k"),
        ("rollout-correction", "decoupled_geo_rs"),
    } <= refs
    r = cli("presets", "show", "hardware/ascend-910c")
    assert r.exit_code == 0 and "gpus_per_node = 16" in r.stdout
    r = cli("presets", "show", "rollout-correction/bypass_pg_is")
    assert r.exit_code == 0 and "reinforce" in r.stdout
    r = cli("presets", "show", "tiny-cpx")
    assert r.exit_code == 2 and "tiny-cpu" in r.stderr
    assert cli("presets", "list", "widgets").exit_code == 2


def test_schema_prints_the_committed_schema(cli) -> None:
    r = cli("schema")
    assert r.exit_code == 0
    assert json.loads(r.stdout) == run_schema()
    assert json.loads(cli("schema", "--hardware").stdout)["properties"]["gpus_per_node"]
    assert cli("schema", "--check").exit_code == 0


def test_data_make_calls_the_engine_writer(cli, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    r = cli("data", "make", "copy", "--out", "d", "--train-size", 8, "--val-size", 4, "--seed", 1, "--json")
    assert r.exit_code == 0, r.output
    paths = json.loads(r.stdout)
    assert set(paths) == {"train", "val"}
    assert (tmp_path / "d" / "train.parquet").is_file()
    assert cli("data", "make", "nope", "--out", "d").exit_code == 2


def test_main_maps_interrupts_and_unexpected_errors(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def boom() -> None:
        raise ValueError("kaput")

    monkeypatch.setattr(app_module, "app", boom)
    monkeypatch.delenv("ASYNCRL_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        app_module.main()
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "internal error: ValueError: kaput" in err and "Traceback" not in err

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(app_module, "app", interrupted)
    with pytest.raises(SystemExit) as e:
        app_module.main()
    assert e.value.code == 130


def test_import_of_the_cli_pulls_no_heavy_packages() -> None:
    """`asyncrl --help` and `validate` must stay fast: no torch/ray/vllm/transformers behind them."""
    code = "import asyncrl_cli.app, asyncrl_cli.config.loader"
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_help_does_not_build_the_config_schema() -> None:
    """`asyncrl --help` only lists commands: the pydantic schema (two thirds of the CLI's import time) loads
    when a command reads a run file, not before."""
    code = (
        "import sys; from asyncrl_cli.app import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' or m.endswith('config.schema')))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv", [["--help"], ["attach", "--help"], ["status", "--help"], ["ctl", "--help"]])
def test_help_loads_neither_the_control_client_nor_the_dashboard(argv: list[str]) -> None:
    """The control plane and the Textual dashboard load when a command talks to a run, not for its help."""
    code = (
        "import sys; from asyncrl_cli.app import app\n"
        f"try:\n    app({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print(sorted(m for m in sys.modules if m.startswith(('engine.control.client', 'engine.control.controller',"
        " 'asyncrl_cli.tui.app', 'textual', 'ray'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_validate_in_a_subprocess_loads_no_heavy_packages() -> None:
    code = (
        "import sys; from asyncrl_cli.app import app\n"
        "try:\n    app(['validate', 'presets/runs/smollm2-arith-cpu.toml'])\nexcept SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
