"""The layers import in one direction: the engine never imports the CLI, engine/algo never imports Ray, and
engine/plan (the formulas the CLI's `validate` shares with the engine) imports nothing heavy.

`make lint` enforces the same with ruff (the CLI ban at any depth, the heavy bans at the top level); this test
reads the sources itself (function bodies included), so the rule
holds on a machine without ruff too, and also catches imports a lint rule could be silenced for.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "vllm", "megatron", "transformers")


def imported_roots(path: Path) -> set[str]:
    """Top-level package of every import in `path` (module level and inside functions alike)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def offenders(folder: str, banned: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{p.relative_to(ROOT)} imports {sorted(imported_roots(p) & set(banned))}"
        for p in (ROOT / folder).rglob("*.py")
        if imported_roots(p) & set(banned)
    )


@pytest.mark.parametrize(
    ("folder", "banned"),
    [("engine", ("asyncrl_cli",)), ("engine/algo", ("ray", "asyncrl_cli")), ("engine/plan", (*HEAVY, "asyncrl_cli")),
     ("engine/config", (*HEAVY, "asyncrl_cli")), ("engine/control", ("torch", "vllm", "megatron", "transformers"))],
)
def test_layer_does_not_import_upwards_or_heavy(folder: str, banned: tuple[str, ...]) -> None:
    assert offenders(folder, banned) == []


def test_the_checker_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from asyncrl_cli.config.derived import derive\n    import ray.util\n")
    assert imported_roots(probe) == {"asyncrl_cli", "ray"}


def test_engine_plan_loads_without_heavy_packages() -> None:
    """Importing every engine/plan module pulls in no torch/ray/vllm/transformers (validate stays fast)."""
    code = (
        "import sys, engine.plan.sizes, engine.plan.hardware, engine.plan.placement, engine.plan.presets, "
        "engine.plan.run_plan, engine.config.schema, engine.control.knobs\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_the_engine_does_not_even_name_the_cli_package() -> None:
    """`grep -rn asyncrl_cli engine/` finds only the lint bans that enforce the direction (a nested ruff.toml
    with its own banned-api table replaces the root's, so it restates the ban): docstrings say "the CLI"."""
    named = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "engine").rglob("*")
                   if p.is_file() and p.suffix in (".py", ".toml", ".md") and p.name != "ruff.toml"
                   and "asyncrl_cli" in p.read_text("utf-8"))
    assert named == []
