"""The layers import in one direction: the engine never imports the CLI, engine/algo never imports Ray,
engine/plan (the formulas the CLI's `validate` shares with the engine) and engine/predict (`asyncrl plan`) import
nothing heavy, and no two engine/ packages import each other, directly or around a circle.

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
     ("engine/predict", (*HEAVY, "asyncrl_cli")),
     ("engine/config", (*HEAVY, "asyncrl_cli")), ("engine/control", ("torch", "vllm", "megatron", "transformers"))],
)
def test_layer_does_not_import_upwards_or_heavy(folder: str, banned: tuple[str, ...]) -> None:
    assert offenders(folder, banned) == []


def engine_imports(path: Path) -> set[str]:
    """Every `engine.*` module `path` imports when it runs: module level and function bodies, not the blocks under
    `if TYPE_CHECKING:` (annotations only; they never execute). `from engine.x import y` counts as `engine.x`."""
    out: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), str(path))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("engine.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("engine."):
            out.add(node.module)
        todo.extend(ast.iter_child_nodes(node))
    return out


def package_graph(root: Path) -> dict[str, dict[str, str]]:
    """engine/'s package-level import graph: {package: {imported package: the first file:import that does it}},
    a package being a folder directly under `root` (engine/loop/sim belongs to engine/loop)."""
    graph: dict[str, dict[str, str]] = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).parts
        if len(parts) < 2:
            continue  # engine/__init__.py, engine/types.py: the shared leaves
        for mod in sorted(engine_imports(p)):
            dst = mod.split(".")[1]
            if dst != parts[0] and (root / dst).is_dir():
                graph.setdefault(parts[0], {}).setdefault(dst, f"{p.relative_to(root.parent)} imports {mod}")
    return graph


def import_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Each circle of the graph once, as a path [a, b, …, a] (a depth-first search from every package; a circle
    is reported from its smallest package name)."""
    found: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], {})):
            if nxt == path[0]:
                found.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return found


def test_no_import_circle_between_engine_packages() -> None:
    """A package that imports another imports nothing that leads back to it (e.g. the weight sync takes its
    device and port as arguments instead of asking the runtime and the trainer)."""
    graph = package_graph(ROOT / "engine")
    circles = [" -> ".join(c) + "  (" + "; ".join(graph[a][b] for a, b in zip(c, c[1:])) + ")"
               for c in import_cycles(graph)]
    assert circles == []


def test_the_circle_check_sees_a_circle_through_a_function_body(tmp_path: Path) -> None:
    """The check fails on a circle of three packages closed by an import inside a function, and ignores one
    closed only under `if TYPE_CHECKING:`."""
    for pkg, body in {"a": "from engine.b.x import f\n", "b": "import engine.c.y\n",
                      "c": "def g():\n    from engine.a import z\n",
                      "d": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.a import z\n",
                      }.items():
        (tmp_path / "engine" / pkg).mkdir(parents=True)
        (tmp_path / "engine" / pkg / "m.py").write_text(body)
    (tmp_path / "engine" / "a" / "n.py").write_text("import engine.d.m\n")
    graph = package_graph(tmp_path / "engine")
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert graph["c"] == {"a": "engine/c/m.py imports engine.a"}


def reexport_only(path: Path) -> bool:
    """A module that defines nothing: besides its docstring it only imports names (`from __future__` aside) and
    lists them in `__all__` — a second name for something that lives elsewhere."""
    body = ast.parse(path.read_text(encoding="utf-8"), str(path)).body
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    rest = [n for n in body if not isinstance(n, (ast.Import, ast.ImportFrom))
            and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
            and not (isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["__all__"])]
    return bool(imports) and not rest


def test_one_name_per_thing_no_module_only_re_exports() -> None:
    """The CLI imports engine names from the engine (`engine.config.schema`, `engine.plan.sizes`, …): no module
    of asyncrl_cli/ or engine/ exists only to give them a second import path."""
    found = sorted(str(p.relative_to(ROOT)) for folder in ("asyncrl_cli", "engine")
                   for p in (ROOT / folder).rglob("*.py") if reexport_only(p))
    assert found == []


def test_the_re_export_check_sees_one(tmp_path: Path) -> None:
    (tmp_path / "alias.py").write_text('"""doc"""\nfrom __future__ import annotations\n\nfrom engine.plan.sizes import '
                                       'derive\n\n__all__ = ["derive"]\n')
    (tmp_path / "real.py").write_text("from engine.plan.sizes import derive\n\n\ndef twice(c):\n    return derive(c)\n")
    assert reexport_only(tmp_path / "alias.py") and not reexport_only(tmp_path / "real.py")


def test_the_checker_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from asyncrl_cli.config.loader import load_run_config\n    import ray.util\n")
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
