"""The built-in tools. Each runs inside the sandbox (`engine.agent.sandbox`), never in the loop's process.

- `calculator(expression)`: exact arithmetic on integers and decimals (+ − × ÷ // % ** and parentheses),
  evaluated over Python's AST with no names, calls or attributes — so an expression is never code.
- `lookup()`: the row's secret (the built-in `lookup` task; its input comes from the row, not the model).
- `python(code)`: a code interpreter (verl's retool `code_interpreter`): runs the code, returns what it
  printed; an exception becomes its last traceback line.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 10_000


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > _MAX_EXPONENT:
                raise ValueError("exponent must be an integer of at most 10000")
        return Fraction(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def _format(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    return repr(float(x))


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. `"123*456 + 7"` → `"56095"`."""
    if not isinstance(expression, str) or len(expression) > 500:
        raise ValueError("expression must be a string of at most 500 characters")
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    try:
        return _format(_eval(tree))
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def lookup(secret: str = "") -> str:
    """The row's secret (the built-in `lookup` task): the tool's input comes from the row's
    `tools_kwargs.lookup.create_kwargs`, not from the model."""
    if not secret:
        raise ValueError("nothing to look up for this prompt")
    return str(secret)


def python(code: str) -> str | None:
    """Run `code` (a code interpreter); its printed output is the result (the sandbox captures it)."""
    if not isinstance(code, str):
        raise ValueError("code must be a string")
    namespace: dict[str, object] = {"__name__": "__tool__"}
    exec(compile(code, "<tool>", "exec"), namespace)  # noqa: S102 - runs inside the sandboxed child only
    return None
