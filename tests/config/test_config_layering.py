"""Layering: extends order, deep merge, arrays replace, --set, provenance, cycles, env vars."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl_cli.config.envexpand import EnvExpansionError, expand
from asyncrl_cli.config.layering import OverrideError, parse_override, resolve_layers
from asyncrl_cli.config.loader import load_run_config
from asyncrl_cli.config.toml_lines import key_lines


def codes(problems) -> list[str]:
    return [p.code for p in problems]


def test_precedence_defaults_extends_file_set(write, minimal) -> None:
    write(
        "base.toml",
        minimal + "[trainer]\nppo_mini_batch_size = 16\ntotal_epochs = 3\n[trainer.optim]\nlr = 1e-5\n",
    )
    run = write("run.toml", 'extends = ["base.toml"]\n[trainer]\nppo_mini_batch_size = 64\n')
    cfg, prov, problems = load_run_config(run, ["trainer.optim.lr=2e-5"], env={})
    assert cfg is not None, problems
    assert cfg.trainer.ppo_mini_batch_size == 64  # the file beats what it extends
    assert cfg.trainer.total_epochs == 3  # tables deep-merge
    assert cfg.trainer.optim.lr == 2e-5  # --set beats every file
    assert cfg.trainer.clip_ratio_low == 0.2  # untouched keys keep the default
    assert prov.get("trainer.ppo_mini_batch_size").where.endswith("run.toml:3")
    assert prov.get("trainer.total_epochs").where.endswith("base.toml:8")
    assert prov.get("trainer.optim.lr").source == "--set"
    assert prov.get("trainer.clip_ratio_low").kind == "default"


def test_later_extends_win_and_arrays_replace(write, minimal) -> None:
    write("a.toml", minimal + 'val_files = ["a1", "a2"]\nmax_prompt_length = 100\n')
    write("b.toml", '[data]\nval_files = ["b1"]\n')
    run = write("run.toml", 'extends = ["a.toml", "b.toml"]\n')
    raw, prov, problems = resolve_layers(run, env={})
    assert not problems
    assert raw["data"]["val_files"] == ["b1"]
    assert raw["data"]["max_prompt_length"] == 100
    assert prov.files[-1].endswith("run.toml")


def test_presets_resolve_by_kind_and_by_bare_name(write) -> None:
    run = write("run.toml", 'extends = ["models/tiny-qwen", "copy", "hardware/cpu"]\n')
    cfg, prov, problems = load_run_config(run, env={})
    assert cfg is not None, [p.render() for p in problems]
    assert cfg.model.path == "builtin:tiny-qwen"
    assert cfg.data.train_files == ["builtin:copy"]
    assert cfg.resources.hardware == "cpu"
    assert "presets/hardware/cpu.toml" in prov.get("resources.hardware").source


def test_unknown_preset_suggests_close_names(write) -> None:
    run = write("run.toml", 'extends = ["models/tiny-qwn"]\n')
    _, _, problems = resolve_layers(run, env={})
    (p,) = [p for p in problems if p.code == "extends-unknown"]
    assert p.key == "extends" and p.line == 1
    assert "tiny-qwen" in (p.hint or "")


def test_cycles_are_reported_with_the_chain(write, minimal) -> None:
    write("a.toml", 'extends = ["b.toml"]\n' + minimal)
    write("b.toml", 'extends = ["./a.toml"]\n')
    _, _, problems = resolve_layers(Path(write("c.toml", 'extends = ["a.toml"]\n')), env={})
    (p,) = [p for p in problems if p.code == "extends-cycle"]
    assert "a.toml → b.toml → a.toml" in p.message
    assert p.file.endswith("b.toml") and p.line == 1


def test_self_extension_is_a_cycle(write, minimal) -> None:
    run = write("self.toml", 'extends = ["self.toml"]\n' + minimal)
    assert "extends-cycle" in codes(resolve_layers(run, env={})[2])


def test_env_expansion_with_defaults_and_nesting() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert expand("${A}/y", env) == ("x/y", ["A"])
    assert expand("${B:-${A}/d}", env) == ("x/d", ["B", "A"])
    assert expand("${EMPTY:-d}", env)[0] == "d"
    assert expand("${EMPTY-d}", env)[0] == ""
    assert expand("runs/${name}", env)[0] == "runs/${name}"  # the run name, not an env var
    assert expand("$${A}", env)[0] == "${A}"
    with pytest.raises(EnvExpansionError, match="NOPE is not set"):
        expand("${NOPE}", env)


def test_env_in_every_string_and_errors_name_file_line_key(write, minimal) -> None:
    run = write("run.toml", minimal + '[logging]\nproject = "${PROJ:-dflt}"\nrun_dir = "${MISSING_DIR}/x"\n')
    _, prov, problems = load_run_config(run, env={"PROJ": "p1"})
    (p,) = [p for p in problems if p.code == "env-unset"]
    assert (p.key, p.line) == ("logging.run_dir", 8)
    assert p.file.endswith("run.toml") and "MISSING_DIR" in p.message
    raw, prov, _ = resolve_layers(run, env={"PROJ": "p1", "MISSING_DIR": "/tmp"})
    assert raw["logging"]["project"] == "p1"
    assert prov.get("logging.project").env_vars == ("PROJ",)


def test_run_dir_gets_the_run_name(write, minimal) -> None:
    cfg, _, _ = load_run_config(write("run.toml", minimal), env={})
    assert cfg is not None and cfg.logging.run_dir == "runs/t"


def test_set_values_are_toml_literals() -> None:
    assert parse_override("trainer.tp=2") == ("trainer.tp", 2)
    assert parse_override("trainer.optim.betas=[0.9, 0.95]") == ("trainer.optim.betas", [0.9, 0.95])
    assert parse_override('model.path="a b"') == ("model.path", "a b")
    assert parse_override("model.path=/x/y") == ("model.path", "/x/y")  # a bare word is a string
    assert parse_override("async_training.partial_rollout=false") == ("async_training.partial_rollout", False)
    for bad in ("trainer.tp", "=3", "a..b=1", "x=[1,"):
        with pytest.raises(OverrideError):
            parse_override(bad)


def test_set_can_create_tables_and_replace_arrays(write, minimal) -> None:
    run = write("run.toml", minimal)
    cfg, prov, _ = load_run_config(
        run, ["data.val_files=['builtin:copy']", "debug.kill_trainer_at_step=3"], env={}
    )
    assert cfg is not None
    assert cfg.data.val_files == ["builtin:copy"] and cfg.debug.kill_trainer_at_step == 3
    assert prov.get("debug.kill_trainer_at_step").kind == "set"


def test_rollout_correction_preset_expands_and_explicit_keys_win(write, minimal) -> None:
    run = write(
        "run.toml",
        minimal + '[algorithm.rollout_correction]\npreset = "decoupled_geo_rs"\n'
        'rollout_rs_threshold = "0.99_1.01"\n',
    )
    cfg, prov, problems = load_run_config(run, env={})
    assert cfg is not None, [p.render() for p in problems]
    rc = cfg.algorithm.rollout_correction
    assert (rc.rollout_rs, rc.bypass_mode) == ("seq_mean_k1", False)
    assert rc.rollout_rs_threshold == "0.99_1.01"
    assert prov.get("algorithm.rollout_correction.rollout_rs").kind == "preset"
    cfg2, _, _ = load_run_config(run, ["algorithm.rollout_correction.bypass_mode=true"], env={})
    assert cfg2 is not None and cfg2.algorithm.rollout_correction.bypass_mode is True


def test_syntax_errors_name_file_line_and_key(write) -> None:
    run = write("bad.toml", 'name = "x"\n[trainer]\ntp = 2\nlr = = 3\n')
    cfg, _, problems = load_run_config(run, env={})
    assert cfg is None
    (p,) = problems
    assert p.code == "toml-syntax" and p.line == 4 and p.file.endswith("bad.toml")
    assert p.key == "trainer.tp" or p.key.startswith("trainer")


def test_key_lines_skip_strings_and_multiline_values() -> None:
    text = 'a = """\nx = 1\n"""\n[t.u]\nb = [\n  1,\n]\n"q.k" = 1\nc.d = {e = 1}\n'
    lines = key_lines(text)
    assert lines == {"a": 1, "t.u": 4, "t.u.b": 5, "t.u.q.k": 8, "t.u.c.d": 9, "t.u.c": 9}
    assert "x" not in lines and "t.u.x" not in lines
