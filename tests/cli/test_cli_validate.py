"""`asyncrl validate`: presets validate, exit codes, JSON, explain, broken files without tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
RUN_PRESETS = sorted(RUNS.glob("*.toml"))
VL16 = RUNS / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml"


def test_there_are_run_presets() -> None:
    names = {p.stem for p in RUN_PRESETS}
    assert {
        "tiny-cpu",
        "tiny-cpu-sync",
        "smollm2-arith-cpu",
        "qwen3-30b-a3b-base-dapo-megatron-96-32",
        "qwen3-30b-a3b-base-dapo-megatron-96-32-mis",
        "qwen3-30b-a3b-base-dapo-megatron-96-32-is",
        "qwen3-vl-8b-geo3k-fsdp2-npu-16-16",
        "qwen3-vl-8b-geo3k-fsdp2-npu-2x8",
        "qwen2.5-math-7b-dapo-fsdp2-64-64",
    } <= names


@pytest.mark.parametrize("preset", RUN_PRESETS, ids=lambda p: p.stem)
def test_every_run_preset_validates(cli, preset: Path) -> None:
    r = cli("validate", preset)
    assert r.exit_code == 0, r.output
    assert "is valid" in r.stdout


def test_all_presets_at_once(cli) -> None:
    r = cli("validate", *RUN_PRESETS)
    assert r.exit_code == 0, r.output


def test_json_reports_params_derived_memory_problems(cli) -> None:
    r = cli("validate", RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32-mis.toml", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["valid"] is True
    assert doc["model"]["params_total"] == pytest.approx(30.5e9, rel=0.02)
    assert doc["model"]["params_active"] == pytest.approx(3.3e9, rel=0.02)
    assert doc["derived"]["max_required_samples"] == 768 and doc["derived"]["total_train_steps"] == 400
    assert doc["memory"]["trainer"]["fits"] and doc["memory"]["rollout"]["components_gb"]["weights"] > 0
    assert all({"severity", "key", "file", "line", "message"} <= set(p) for p in doc["problems"])


def test_16_per_node_exits_3_and_names_gpus_per_node(cli) -> None:
    r = cli("validate", VL16, "--set", 'resources.hardware="ascend-910b"')
    assert r.exit_code == 3, r.output
    assert "resources.trainer.gpus_per_node" in r.stdout and "16-16.toml:17" in r.stdout
    doc = json.loads(cli("validate", VL16, "--set", "resources.hardware=ascend-910b", "--json").stdout)
    assert doc["exit_code"] == 3
    assert {p["key"] for p in doc["problems"] if p["severity"] == "error"} >= {
        "resources.trainer.gpus_per_node"
    }


def test_explain_shows_where_each_key_came_from(cli) -> None:
    r = cli("validate", RUNS / "tiny-cpu-sync.toml", "--explain", "--set", "trainer.optim.lr=1e-4")
    assert r.exit_code == 0
    out = r.stdout
    mode_line = (RUNS / "tiny-cpu-sync.toml").read_text().splitlines().index('mode = "sync"') + 1
    assert "async_training.mode" in out and f"tiny-cpu-sync.toml:{mode_line}" in out
    assert "presets/models/tiny-qwen.toml:4" in out
    assert "--set" in out
    doc = json.loads(cli("validate", RUNS / "tiny-cpu-sync.toml", "--explain", "--json").stdout)
    lr_line = (RUNS / "tiny-cpu.toml").read_text().splitlines().index("lr = 3e-4") + 1
    assert doc["provenance"]["keys"]["trainer.optim.lr"]["where"].endswith(f"tiny-cpu.toml:{lr_line}")



@pytest.mark.parametrize("width", [40, 60, 80, 200])
def test_explain_never_cuts_a_key_or_its_source_whatever_the_width(width: int, tmp_path: Path) -> None:
    """A narrow terminal, or a checkout whose paths are long, gets one line per key instead of a cut table."""
    import io

    from rich.console import Console

    from asyncrl_cli.config.loader import analyze_run_config
    from asyncrl_cli.report import render_provenance

    deep = tmp_path / ("a-directory-with-a-long-name-" * 3) / "run.toml"  # sources of 100+ characters
    deep.parent.mkdir(parents=True)
    deep.write_text('extends = ["runs/tiny-cpu-sync"]\n[rollout]\ntemperature = 0.7\n')
    for run in (RUNS / "tiny-cpu-sync.toml", deep):
        an = analyze_run_config(run, ["trainer.optim.lr=1e-4"])
        buf = io.StringIO()
        render_provenance(Console(file=buf, width=width, force_terminal=False, color_system=None), an)
        out = buf.getvalue()
        assert "…" not in out and "..." not in out
        for key, origin in an.provenance.origins.items():
            line = next((ln for ln in out.splitlines() if key in ln.split()), None)
            assert line is not None, (key, out)  # the whole key, as one word
            assert origin.where in line, (key, origin.where, out)  # and its whole source, on its line


BROKEN = {
    "syntax.toml": ('name = "x"\n[trainer\ntp = 2\n', "syntax.toml:2"),
    "types.toml": ('extends = ["runs/tiny-cpu"]\n[trainer]\nppo_epochs = "many"\n', "types.toml:3"),
    "unknown.toml": ('extends = ["runs/tiny-cpu"]\n[rollout]\ntemprature = 0.7\n', "types.toml:3"),
    "negative.toml": ('extends = ["runs/tiny-cpu"]\n[data]\nmax_prompt_length = -1\n', "negative.toml:3"),
    "envvar.toml": (
        'extends = ["runs/tiny-cpu"]\n[model]\npath = "${SURELY_UNSET_VAR_X}"\n',
        "envvar.toml:3",
    ),
    "cycle.toml": ('extends = ["cycle.toml"]\n', "cycle.toml:1"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_files_exit_1_with_file_line_key_and_no_traceback(cli, name: str, tmp_path: Path) -> None:
    text, where = BROKEN[name]
    (tmp_path / name).write_text(text)
    r = cli("validate", name)
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    if name != "unknown.toml":
        assert where in r.stdout
    else:
        assert "unknown.toml:3" in r.stdout and "did you mean 'rollout.temperature'" in r.stdout
    key = {
        "syntax.toml": "trainer",
        "types.toml": "trainer.ppo_epochs",
        "unknown.toml": "rollout.temprature",
        "negative.toml": "data.max_prompt_length",
        "envvar.toml": "model.path",
        "cycle.toml": "extends",
    }[name]
    assert key in r.stdout


def test_usage_errors_exit_2(cli) -> None:
    r = cli("validate", "missing.toml")
    assert r.exit_code == 2 and "run file not found" in r.stderr
    r = cli("validate", RUNS / "tiny-cpu.toml", "--set", "no_equals_sign")
    assert r.exit_code == 2 and "--set expects" in r.stderr
    assert cli("validate").exit_code == 2
    assert cli("validate", RUNS / "tiny-cpu.toml", "--no-such-flag").exit_code == 2


def test_worst_exit_code_wins_across_files(cli, tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('extends = ["runs/tiny-cpu"]\n[rollout]\nn = 0\n')
    assert cli("validate", RUNS / "tiny-cpu.toml", "bad.toml").exit_code == 1
    r = cli("validate", RUNS / "tiny-cpu.toml", VL16, "--set", "resources.hardware=ascend-910b", "--json")
    assert r.exit_code == 3 and json.loads(r.stdout)["exit_code"] == 3


def test_validation_at_n_needs_sampling(cli) -> None:
    """n greedy answers per prompt would be one answer n times: validate refuses it, naming the key."""
    r = cli("validate", RUNS / "tiny-cpu.toml", "--set", "rollout.val_n=4")
    assert r.exit_code == 1
    assert "rollout.val_n" in r.output and "val_n = 4 answers per prompt need sampling" in r.output
    r = cli("validate", RUNS / "tiny-cpu.toml", "--set", "rollout.val_n=4", "--set", "rollout.val_temperature=1.0")
    assert r.exit_code == 0, r.output
