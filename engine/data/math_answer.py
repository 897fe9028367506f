"""Answer extraction and comparison for math rewards (pure string functions).

- `last_boxed(text)`: the content of the last `\\boxed{...}` (brace-matched) or `\\boxed X` / `\\fbox{...}`.
- `normalize_math_answer(s)`: the Hendrycks-MATH normalisation verl's `math` scorer applies before an exact
  string comparison: drop line breaks, `\\!`, `\\left`/`\\right`, degree marks, `\\$`, `%`, a trailing
  `\\text{ unit}`, spaces; `tfrac`/`dfrac` → `frac`; `\\frac12` → `\\frac{1}{2}`; `\\sqrt3` → `\\sqrt{3}`;
  `.5` → `0.5`; `0.5` → `\\frac{1}{2}`; integer `a/b` → `\\frac{a}{b}`; `x = 3` → `3` (short left side).
- `numeric_value(s)`: the value of a simple LaTeX numeric expression (numbers, `\\frac`, `\\sqrt`, `\\pi`,
  `+ - * / ^`, implicit products like `2\\sqrt{3}`), or None; evaluated on a whitelisted AST, never `eval`.
- `answers_match(pred, truth, rel_tol)`: equal after normalisation, or both numeric with
  |p − t| ≤ rel_tol · max(|p|, |t|) (plus 1e-9 absolute slack).
"""

from __future__ import annotations

import ast
import math
import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` (or `\\boxed X` up to `$`), else None."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd) :]
    if rest.startswith(" "):
        return rest[1:].split("$")[0].strip()
    end = _matching_brace(rest) if rest.startswith("{") else None
    return rest[1:end] if end is not None else None


def _fix_fracs(s: str) -> str:
    """`\\frac12` → `\\frac{1}{2}`, `\\frac1{2}` → `\\frac{1}{2}`, `\\frac{1}2` → `\\frac{1}{2}`."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{"):
            close = _matching_brace(part)
            if close is not None and close + 1 < len(part) and part[close + 1] not in "{":
                num, tail = part[: close + 1], part[close + 1 :]
                part = num + "{" + tail[0] + "}" + tail[1:]
            out += part
            continue
        if len(part) < 2:
            out += part
            continue
        num, rest = part[0], part[1:]
        if rest.startswith("{"):
            out += "{" + num + "}" + rest
        else:
            out += "{" + num + "}{" + rest[0] + "}" + rest[1:]
    return out


def _matching_brace(s: str) -> int | None:
    depth = 0
    for i, ch in enumerate(s):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _fix_sqrt(s: str) -> str:
    """`\\sqrt3` → `\\sqrt{3}` (one-character radicand without braces)."""
    return re.sub(r"\\sqrt(?!\{)\s*([^\s{\\])", r"\\sqrt{\1}", s)


def _fix_slash(s: str) -> str:
    """`3/4` → `\\frac{3}{4}` when both sides are integers."""
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def normalize_math_answer(s: str) -> str:
    """Canonical string form of a math answer (see the module docstring for the rules)."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    if "\\text{ " in s:
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.strip()
    if s.startswith("."):
        s = "0" + s
    if s.count("=") == 1:
        left, right = s.split("=")
        if len(left.strip()) <= 2:
            s = right
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


_ALLOWED_FUNCS = {"sqrt": math.sqrt}
_ALLOWED_NAMES = {"pi": math.pi}


def _latex_to_expr(s: str) -> str:
    s = re.sub(r"\\(?:text|mbox|mathrm)\{[^{}]*\}", "", s)
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi")
    s = s.replace("\\sqrt", "sqrt").replace("^", "**").replace(",", "")
    while "\\frac" in s:
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        if new == s:
            break
        s = new
    s = s.replace("{", "(").replace("}", ")").replace(" ", "")
    s = re.sub(r"(\d|\))(?=[a-z(])", r"\1*", s)  # implicit products: 2sqrt(3), 2pi, )(
    return s


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    is_number = isinstance(node, ast.Constant) and type(node.value) in (int, float)
    if is_number:
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in _ALLOWED_NAMES:
        return _ALLOWED_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval_node(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        a, b = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
            raise ValueError("exponent too large")
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        if isinstance(node.op, ast.Div):
            return a / b
        if isinstance(node.op, ast.Pow):
            return float(a**b)
        return ops[type(node.op)]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _ALLOWED_FUNCS
        and len(node.args) == 1
        and not node.keywords
    ):
        return _ALLOWED_FUNCS[node.func.id](_eval_node(node.args[0]))
    raise ValueError(f"unsupported expression node {type(node).__name__}")


def numeric_value(s: str) -> float | None:
    """The value of a simple numeric LaTeX expression, or None when it is not one."""
    expr = _latex_to_expr(normalize_math_answer(s))
    if not expr or len(expr) > 200:
        return None
    try:
        value = _eval_node(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError):
        return None
    if isinstance(value, complex) or not math.isfinite(value):
        return None
    return float(value)


def answers_match(pred: str, truth: str, rel_tol: float = 1e-4) -> bool:
    """True when `pred` equals `truth` after normalisation or, both being numeric, within `rel_tol`."""
    p, t = normalize_math_answer(pred), normalize_math_answer(truth)
    if p == t:
        return True
    pv, tv = numeric_value(pred), numeric_value(truth)
    if pv is None or tv is None:
        return False
    return math.isclose(pv, tv, rel_tol=rel_tol, abs_tol=1e-9)
