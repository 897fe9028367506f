"""A small, static reader of bash scripts as verl writes them: assignments, quoting, expansions.

It never runs anything. It understands what verl's launch scripts use:
- assignments `NAME=value` / `export NAME=value` (values may be multi-line double-quoted blocks);
- quoting (`'...'`, `"..."`, backslash escapes and line continuations) and comments;
- `$NAME`, `${NAME}`, `${NAME:-default}` and `$((arithmetic))` (bare names allowed inside);
- word splitting of unquoted expansions, so `$DATA_CONFIG` on the command line becomes its overrides;
- arrays: `NAME=( word … )` / `NAME+=( … )`, and `"${NAME[@]}"` / `${NAME[*]}` expand to one word per element;
- positional parameters: `${1:-default}` takes its default (the script runs without arguments here) and is
  noted; a bare `$1` (no default) is reported as unparsed.

Values keep their environment overrides symbolically: a variable the script does not define, or defines as
`X=${X:-default}`, is written in asyncrl's `${X:-default}` syntax (`$HOME` → `${HOME}`). Arithmetic uses
the defaults. Control flow (`if … then … fi`) is read straight through; `$(command)` stays literal.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from asyncrl_cli.config.envexpand import closing_brace

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "for", "while", "until", "case", "esac"}


@dataclass
class Script:
    """What the script defines: variables (symbolic values) and simple commands (expanded words)."""

    variables: dict[str, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)
    env_defaults: dict[str, str] = field(default_factory=dict)
    """Variables written as `X=${X:-default}`: the environment overrides them."""
    arrays: dict[str, list[str]] = field(default_factory=dict)
    """Bash arrays (`NAME=( … )`), element by element."""
    notes: list[str] = field(default_factory=list)
    """What the reader assumed (a positional parameter's default)."""
    unparsed: list[str] = field(default_factory=list)
    """Constructs the reader could not resolve (reported, never dropped silently)."""


ARRAY_SEP = "\x00"
"""Separates the elements of an expanded array inside one word (they become separate words)."""
_POSITIONAL = re.compile(r"^([0-9]+|[@*#])(:?-)?(.*)$", re.S)
_ARRAY_REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]$")
_ARRAY_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\(")


_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.floordiv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}  # fmt: skip


def _eval_int(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _eval_int(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_int(node.operand)
    raise ValueError("unsupported arithmetic")


def concrete(value: str) -> str:
    """A symbolic value with every `${X:-default}` replaced by its default (`${X}` by nothing)."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("${", i):
            end = closing_brace(value, i + 2)
            j = len(value) if end is None else end + 1  # an unclosed `${` runs to the end
            body = value[i + 2 : j - 1]
            m = _NAME.match(body)
            rest = body[m.end() :] if m else ""
            if rest.startswith(":-"):
                out.append(concrete(rest[2:]))
            elif rest.startswith("-"):
                out.append(concrete(rest[1:]))
            i = j
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


class _Reader:
    def __init__(self, text: str, script: Script) -> None:
        self.s = text
        self.i = 0
        self.sc = script

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def eof(self) -> bool:
        return self.i >= len(self.s)

    # --- expansions -------------------------------------------------------------------------------
    def lookup(self, name: str) -> str:
        if name in self.sc.variables:
            return self.sc.variables[name]
        return "${" + name + "}"

    def read_braced(self) -> str:
        """After `${`: read to the matching `}` and expand."""
        start = self.i
        depth = 1
        while not self.eof() and depth:
            if self.peek(2) == "${":
                depth += 1
                self.i += 2
                continue
            if self.peek() == "}":
                depth -= 1
            self.i += 1
        body = self.s[start : self.i - 1]
        arr = _ARRAY_REF.match(body)
        if arr:
            if arr.group(1) in self.sc.arrays:
                return ARRAY_SEP.join(self.sc.arrays[arr.group(1)])
            self.sc.unparsed.append(f"${{{body}}}: no such array in the script")
            return ""
        pos = _POSITIONAL.match(body)
        if pos:
            if pos.group(2):
                default = _expand_word(pos.group(3), self.sc)
                self.sc.notes.append(f"positional parameter ${pos.group(1)} not given: its default {default!r} used")
                return default
            self.sc.unparsed.append(f"${{{body}}}: a positional parameter without a default")
            return "${" + body + "}"
        m = _NAME.match(body)
        if not m:
            self.sc.unparsed.append(f"${{{body}}}: an expansion the reader does not evaluate")
            return "${" + body + "}"
        name, rest = m.group(0), body[m.end() :]
        if rest.startswith(":-") or rest.startswith("-"):
            default = _expand_word(rest[2:] if rest.startswith(":-") else rest[1:], self.sc)
            if name in self.sc.variables:
                return self.sc.variables[name]
            return "${" + name + ":-" + default + "}"
        return self.lookup(name)

    def read_arith(self) -> str:
        """After `$((`: evaluate to an integer string (symbolic values use their defaults)."""
        start = self.i
        depth = 2
        while not self.eof() and depth:
            c = self.peek()
            depth += 1 if c == "(" else -1 if c == ")" else 0
            self.i += 1
        expr = self.s[start : self.i - 2]
        expr = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)

        def value(m: re.Match[str]) -> str:
            return concrete(self.sc.variables.get(m.group(0), "0")) or "0"

        expr = _NAME.sub(value, expr)
        try:
            return str(_eval_int(ast.parse(expr.strip(), mode="eval")))
        except ZeroDivisionError:
            self.sc.unparsed.append(f"$(({self.s[start : self.i - 2]})): division by zero")
            return "$((" + self.s[start : self.i - 2] + "))"
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return "$((" + self.s[start : self.i - 2] + "))"

    def read_dollar(self) -> str:
        """At `$`: one expansion."""
        self.i += 1
        if self.peek(2) == "((":
            self.i += 2
            return self.read_arith()
        if self.peek() == "(":
            start = self.i
            depth = 0
            while not self.eof():
                c = self.peek()
                depth += 1 if c == "(" else -1 if c == ")" else 0
                self.i += 1
                if depth == 0:
                    break
            return "$" + self.s[start : self.i]
        if self.peek() == "{":
            self.i += 1
            return self.read_braced()
        m = _NAME.match(self.s, self.i)
        if m:
            self.i = m.end()
            return self.lookup(m.group(0))
        if self.peek().isdigit():
            self.sc.unparsed.append(f"${self.peek()}: a positional parameter without a default")
            self.i += 1
            return "${" + self.s[self.i - 1] + "}"
        return "$"

    # --- words ------------------------------------------------------------------------------------
    def read_word(self, stop: str = "") -> list[tuple[str, bool]]:
        """Parts of one word: (text, splittable) — unquoted expansions are splittable. An unquoted character of
        `stop` ends the word too (`)` inside an array's list)."""
        parts: list[tuple[str, bool]] = []
        while not self.eof():
            c = self.peek()
            if c in " \t\n;|&" or c in stop:
                break
            if c == "\\":
                if self.peek(2) == "\\\n":
                    self.i += 2
                    continue
                parts.append((self.s[self.i + 1 : self.i + 2], False))
                self.i += 2
            elif c == "'":
                end = self.s.find("'", self.i + 1)
                end = len(self.s) if end < 0 else end
                parts.append((self.s[self.i + 1 : end], False))
                self.i = end + 1
            elif c == '"':
                self.i += 1
                buf: list[str] = []
                while not self.eof() and self.peek() != '"':
                    if self.peek() == "\\" and self.peek(2)[1:] in ('"', "\\", "$", "\n"):
                        if self.peek(2)[1:] != "\n":
                            buf.append(self.s[self.i + 1])
                        self.i += 2
                    elif self.peek() == "$":
                        buf.append(self.read_dollar())
                    else:
                        buf.append(self.peek())
                        self.i += 1
                self.i += 1
                parts.append(("".join(buf), False))
            elif c == "$":
                parts.append((self.read_dollar(), True))
            else:
                parts.append((c, False))
                self.i += 1
        return parts

    def read_array(self, m: re.Match[str]) -> None:
        """`NAME=( … )` / `NAME+=( … )`: the elements, expanded (comments and newlines between them allowed)."""
        self.i = m.end()
        elements: list[str] = []
        while not self.eof() and self.peek() != ")":
            c = self.peek()
            if c in " \t\n" or self.peek(2) == "\\\n":
                self.i += 2 if c == "\\" else 1
            elif c == "#":
                while not self.eof() and self.peek() != "\n":
                    self.i += 1
            else:
                start = self.i
                elements += _split([self.read_word(stop=")")])
                if self.i == start:  # an operator inside the list (`;`, `|`, `&`): not an element
                    self.sc.unparsed.append(f"{c!r} inside the array {m.group(1)}=( … )")
                    self.i += 1
        self.i += 1
        name = m.group(1)
        self.sc.arrays[name] = (self.sc.arrays.get(name, []) if m.group(2) else []) + elements
        self.sc.variables[name] = " ".join(self.sc.arrays[name])

    def statements(self) -> None:
        words: list[list[tuple[str, bool]]] = []
        while not self.eof():
            c = self.peek()
            if c in " \t":
                self.i += 1
            elif self.peek(2) == "\\\n":
                self.i += 2
            elif c == "#":
                while not self.eof() and self.peek() != "\n":
                    self.i += 1
            elif c in "\n;|&":
                self.i += 1
                self.finish(words)
                words = []
            elif not words and _ARRAY_ASSIGN.match(self.s, self.i):
                self.read_array(_ARRAY_ASSIGN.match(self.s, self.i))
            else:
                words.append(self.read_word())
        self.finish(words)

    def finish(self, raw_words: list[list[tuple[str, bool]]]) -> None:
        """Run one statement: assignments update the variables, other words form a command."""
        words_raw = list(raw_words)
        while words_raw and "".join(t for t, _ in words_raw[0]) in KEYWORDS | {"export", "local", "readonly"}:
            words_raw.pop(0)
        assigned = False
        while words_raw:
            first = words_raw[0]
            literal = "".join(t for t, s in first if not s) if first else ""
            m = _ASSIGN.match(literal) if first and not first[0][1] else None
            if not m:
                break
            name = m.group(1)
            value = "".join(t for t, _ in first)[len(name) + 1 :]
            if re.fullmatch(r"\$\{" + name + r":?-.*\}", value, flags=re.S):
                self.sc.env_defaults[name] = value
            self.sc.variables[name] = value
            words_raw.pop(0)
            assigned = True
        if words_raw:
            self.sc.commands.append(_split(words_raw))
        elif not assigned:
            return


def _split(words: list[list[tuple[str, bool]]]) -> list[str]:
    """Join each word's parts, splitting unquoted expansions on whitespace."""
    out: list[str] = []
    for parts in words:
        current = ""
        have = False
        for text, splittable in parts:
            if ARRAY_SEP in text:  # "${arr[@]}": one word per element, quoted or not
                first, *rest = text.split(ARRAY_SEP)
                current += first
                for element in rest:
                    if current:
                        out.append(current)
                    current = element
                have = True
                continue
            if not splittable:
                current += text
                have = True
                continue
            pieces = re.split(r"[ \t\n]+", text)
            for k, piece in enumerate(pieces):
                if k > 0:
                    if have and current:
                        out.append(current)
                    current, have = "", False
                current += piece
                have = have or bool(piece)
        if have and current:
            out.append(current)
    return out


def _expand_word(text: str, script: Script) -> str:
    """Quote removal and expansion of one word's text (no splitting), e.g. a `${X:-default}` default."""
    r = _Reader(text, script)
    parts: list[str] = []
    while not r.eof():
        if r.peek() in " \t\n":
            parts.append(r.peek())
            r.i += 1
            continue
        parts.append("".join(t for t, _ in r.read_word()))
    return "".join(parts)


def parse_script(text: str) -> Script:
    """Read a bash script statically."""
    sc = Script()
    _Reader(text, sc).statements()
    return sc
