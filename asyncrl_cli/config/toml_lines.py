"""Line numbers of the keys of a TOML document (tomllib parses values but forgets positions).

`key_lines(text)` scans the text once, skipping strings (basic, literal, multi-line), comments and
multi-line arrays/inline tables, and records the 1-based line of every table header and every key
assignment by its full dotted path (`[a.b]` + `c = 1` → `"a.b.c"`). Keys inside inline tables are not
recorded separately: they share the line of the key that holds the inline table.
"""

from __future__ import annotations

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def advance(self, n: int = 1) -> None:
        chunk = self.s[self.i : self.i + n]
        self.line += chunk.count("\n")
        self.i += n

    def eof(self) -> bool:
        return self.i >= len(self.s)

    def skip_inline_ws(self) -> None:
        while not self.eof() and self.peek() in " \t":
            self.advance()

    def skip_to_eol(self) -> None:
        while not self.eof() and self.peek() != "\n":
            self.advance()

    def read_string(self) -> str:
        """Consume a string starting at the cursor and return its (unescaped enough) content."""
        for quote in ('"""', "'''"):
            if self.peek(3) == quote:
                self.advance(3)
                start = self.i
                while not self.eof() and self.peek(3) != quote:
                    self.advance(2 if quote == '"""' and self.peek() == "\\" else 1)
                content = self.s[start : self.i]
                self.advance(3)
                while self.peek() == quote[0]:  # up to two extra quotes belong to the content
                    self.advance()
                return content
        quote = self.peek()
        self.advance()
        start = self.i
        while not self.eof() and self.peek() not in (quote, "\n"):
            self.advance(2 if quote == '"' and self.peek() == "\\" else 1)
        content = self.s[start : self.i]
        self.advance()
        return content

    def read_key(self) -> list[str]:
        """A dotted key: bare or quoted parts separated by dots."""
        parts: list[str] = []
        while not self.eof():
            self.skip_inline_ws()
            c = self.peek()
            if c in "\"'":
                parts.append(self.read_string())
            else:
                start = self.i
                while not self.eof() and self.peek() in _BARE:
                    self.advance()
                if self.i == start:
                    break
                parts.append(self.s[start : self.i])
            self.skip_inline_ws()
            if self.peek() == ".":
                self.advance()
                continue
            break
        return parts

    def skip_value(self) -> None:
        """Consume a value up to the end of its statement (through nested brackets and strings)."""
        depth = 0
        while not self.eof():
            c = self.peek()
            if c in "\"'":
                self.read_string()
            elif c == "#":
                self.skip_to_eol()
            elif c in "[{":
                depth += 1
                self.advance()
            elif c in "]}":
                depth -= 1
                self.advance()
            elif c == "\n":
                if depth <= 0:
                    return
                self.advance()
            else:
                self.advance()


def key_lines(text: str) -> dict[str, int]:
    """Map each dotted key path (tables and keys) to the 1-based line where it is written."""
    sc = _Scanner(text)
    lines: dict[str, int] = {}
    table: list[str] = []
    while not sc.eof():
        sc.skip_inline_ws()
        c = sc.peek()
        if c in ("\n", "\r"):
            sc.advance()
        elif c == "#":
            sc.skip_to_eol()
        elif c == "[":
            line = sc.line
            sc.advance(2 if sc.peek(2) == "[[" else 1)
            table = sc.read_key()
            lines.setdefault(".".join(table), line)
            sc.skip_to_eol()
        else:
            line = sc.line
            key = sc.read_key()
            if not key:
                sc.skip_to_eol()
                continue
            sc.skip_inline_ws()
            if sc.peek() == "=":
                sc.advance()
            lines[".".join(table + key)] = line
            for k in range(1, len(key)):  # dotted keys define their parent tables implicitly
                lines.setdefault(".".join(table + key[:k]), line)
            sc.skip_value()
    return lines
