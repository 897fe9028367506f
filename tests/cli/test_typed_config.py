"""One typed boundary: no engine function takes its configuration untyped.

The run plan and the typed config sections are what the engine passes around; a parameter `cfg: Any` (or
`config: Any`, `*_cfg: Any`) hides which section a function reads and lets re-derivations creep back in. This test
reads the sources (annotations are strings under `from __future__ import annotations`, so it is an AST check).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def untyped_config_params(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line name` of each function parameter named like a configuration and annotated `Any` (or `typing.Any`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            named = arg.arg in ("cfg", "config") or arg.arg.endswith(("_cfg", "_config"))
            ann = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if named and ann.strip("'\"") in ("Any", "typing.Any"):
                out.append(f"{path.relative_to(root)}:{arg.lineno} {arg.arg}: {ann}")
    return out


def test_no_engine_function_takes_its_config_as_any() -> None:
    found = [hit for p in sorted((ROOT / "engine").rglob("*.py")) for hit in untyped_config_params(p)]
    assert found == []


def test_the_check_sees_an_untyped_config(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("from typing import Any\n\ndef f(x: int, cfg: Any) -> None: ...\n\n"
                   "class C:\n    def g(self, *, rollout_cfg: 'Any') -> None: ...\n")
    found = untyped_config_params(bad, root=tmp_path)
    assert [h.split(" ", 1)[1] for h in found] == ["cfg: Any", "rollout_cfg: 'Any'"]
