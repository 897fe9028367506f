"""`${VAR}` / `${VAR:-default}` expansion of config strings.

Grammar (a subset of POSIX shell parameter expansion, nestable in defaults):
- `${VAR}`: the value of VAR; an error when VAR is unset.
- `${VAR:-default}`: VAR when set and non-empty, else `default` (itself expanded).
- `${VAR-default}`: VAR when set (even empty), else `default`.
- `$${` is a literal `${`; `${name}` is not an environment variable but the run name, substituted by the
  loader after validation (e.g. `run_dir = "runs/${name}"`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED = frozenset({"name"})
"""`${name}` refers to the config's run name, not to the environment."""


class EnvExpansionError(ValueError):
    """An unset variable without a default, or a malformed `${...}`; `var` names the variable."""

    def __init__(self, message: str, var: str | None = None) -> None:
        super().__init__(message)
        self.var = var


def closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing the `${` whose `{` is at `start - 1` (nested `${…}` skipped), None if unclosed."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _matching_brace(text: str, start: int) -> int:
    """`closing_brace`, or EnvExpansionError when the `${` is not closed."""
    end = closing_brace(text, start)
    if end is None:
        raise EnvExpansionError(f"unclosed '${{' in {text!r}")
    return end


def expand(text: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Expand `text`; return it with the variable names referenced, outermost first."""
    out: list[str] = []
    used: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$${", i):
            out.append("${")
            i += 3
            continue
        if not text.startswith("${", i):
            out.append(text[i])
            i += 1
            continue
        end = _matching_brace(text, i + 2)
        body = text[i + 2 : end]
        m = _NAME.match(body)
        if not m:
            raise EnvExpansionError(f"malformed '${{{body}}}': expected ${{VAR}} or ${{VAR:-default}}")
        var, rest = m.group(0), body[m.end() :]
        if var in RESERVED and not rest:
            out.append(text[i : end + 1])
            i = end + 1
            continue
        used.append(var)
        value = env.get(var)
        if rest.startswith(":-") or rest.startswith("-"):
            default = rest[2:] if rest.startswith(":-") else rest[1:]
            use_default = value is None or (rest.startswith(":-") and value == "")
            if use_default:
                value, inner = expand(default, env)
                used.extend(inner)
        elif rest:
            raise EnvExpansionError(f"malformed '${{{body}}}': only ':-' and '-' defaults are supported", var)
        elif value is None:
            raise EnvExpansionError(
                f"environment variable {var} is not set and has no default (write ${{{var}:-default}})", var
            )
        out.append(value)
        i = end + 1
    return "".join(out), used
