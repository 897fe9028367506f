"""TOML layering: `extends` chains, `${ENV}` expansion, `--set` overrides, provenance.

Order, lowest first: schema defaults → each file's `extends` (in order, depth first) → the file itself →
`--set a.b=v` flags (in order). Tables deep-merge, arrays and scalars replace. A file may name in
`extends`:
- a path ending in `.toml` (relative to the file that names it), or
- a preset: `kind/name` or a bare `name` under `presets/{runs,models,datasets,hardware}`; extending a
  hardware preset sets `resources.hardware` to its name.

Every string of every layer is expanded (`${VAR:-default}`, see `envexpand`). Every problem — syntax
errors, unreadable files, cycles, unknown presets, unset variables — is collected with file, line and
key; nothing is raised for problems in files. Only malformed `--set` flags raise `OverrideError` (a
usage error).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl_cli.config.catalog import find_preset, preset_names
from asyncrl_cli.config.dotted import get_path, nearest, set_path
from asyncrl_cli.config.envexpand import EnvExpansionError, expand
from asyncrl_cli.config.problems import Problem
from asyncrl_cli.config.provenance import Origin, Provenance
from engine.config.rc_presets import RC_PRESETS, canonical_preset_name
from asyncrl_cli.config.toml_lines import key_lines

RC_KEY = "algorithm.rollout_correction"
_LINE_RE = re.compile(r"at line (\d+)")
_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


class OverrideError(ValueError):
    """A `--set` flag that is not `dotted.key=value`."""


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=v` → ("a.b", v) with v parsed as a TOML literal (a bare word is taken as a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY_RE.match(key):
        raise OverrideError(f"--set expects dotted.key=value, got {text!r}")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if raw.startswith(("[", "{", '"', "'")):
            raise OverrideError(f"--set {key}: {raw!r} is not a valid TOML value") from None
        value = raw
    return key, value


@dataclass
class Layer:
    """One parsed, env-expanded layer and where its keys were written."""

    data: dict[str, Any]
    source: str
    kind: str
    lines: dict[str, int] = field(default_factory=dict)
    env: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def line_of(self, key: str) -> int | None:
        """Line of `key` or of its nearest written ancestor."""
        return nearest(self.lines, key)

    def origin(self, key: str) -> Origin:
        """The provenance record of `key` in this layer."""
        env = self.env.get(key, ())
        return Origin(self.kind, self.source, self.line_of(key), env)  # type: ignore[arg-type]


def _expand_tree(
    node: Any, prefix: str, layer: Layer, env: Mapping[str, str], problems: list[Problem]
) -> Any:
    """Expand every string below `node`; record the variables used per key; collect errors."""
    if isinstance(node, dict):
        return {
            k: _expand_tree(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}", layer, env, problems)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_expand_tree(v, prefix, layer, env, problems) for v in node]
    if isinstance(node, str) and "$" in node:
        try:
            value, used = expand(node, env)
        except EnvExpansionError as e:
            problems.append(
                Problem(
                    "error",
                    "env-unset" if e.var else "env-syntax",
                    str(e),
                    prefix,
                    layer.source,
                    layer.line_of(prefix),
                )
            )
            return node
        if used:
            prior = layer.env.get(prefix, ())
            layer.env[prefix] = prior + tuple(u for u in used if u not in prior)
        return value
    return node


def _merge(
    base: dict[str, Any], top: dict[str, Any], layer: Layer, prov: Provenance, prefix: str = ""
) -> None:
    """Deep-merge `top` into `base` in place, recording the origin of every leaf that `top` sets."""
    for k, v in top.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v, layer, prov, key + ".")
            continue
        prov.drop_subtree(key)
        if isinstance(v, dict):
            base[k] = {}
            _merge(base[k], v, layer, prov, key + ".")
            if not v:
                prov.origins[key] = layer.origin(key)
        else:
            base[k] = v
            prov.origins[key] = layer.origin(key)


class _Resolver:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[Problem] = []
        self.layers: list[Layer] = []

    def read(self, path: Path, stack: list[Path]) -> Layer | None:
        """Parse one file, expand it, and queue its `extends` first, then itself."""
        source = display_path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            self.problems.append(
                Problem("error", "read-error", f"cannot read file: {e.strerror or e}", None, source, None)
            )
            return None
        except UnicodeDecodeError as e:
            self.problems.append(
                Problem("error", "read-error", f"not a UTF-8 text file (byte {e.start}): TOML files must be UTF-8",
                        None, source, None)
            )
            return None
        lines = key_lines(text)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = _LINE_RE.search(str(e))
            line = int(m.group(1)) if m else None
            key = None
            if line is not None:
                before = [(ln, k) for k, ln in lines.items() if ln <= line]
                key = max(before)[1] if before else None
            msg = _LINE_RE.split(str(e))[0].rstrip(" (") or str(e)
            self.problems.append(
                Problem("error", "toml-syntax", f"TOML syntax error: {msg}", key, source, line)
            )
            return None
        layer = Layer({}, source, "preset" if _is_preset(path) else "file", lines)
        extends_raw = data.pop("extends", [])
        layer.data = _expand_tree(data, "", layer, self.env, self.problems)
        extends = self._extends_list(extends_raw, layer)
        for ref in extends:
            target = self._resolve_ref(ref, path, layer)
            if target is None:
                continue
            resolved = [p.resolve() for p in stack]
            if target.resolve() in resolved:
                loop = [*stack[resolved.index(target.resolve()) :], target]
                base = loop[0].resolve().parent
                chain = " → ".join(os.path.relpath(p.resolve(), base) for p in loop)
                self.problems.append(
                    Problem(
                        "error",
                        "extends-cycle",
                        f"extends cycle: {chain}",
                        "extends",
                        source,
                        lines.get("extends"),
                    )
                )
                continue
            if _kind_of(target) == "hardware":
                hw = Layer({"resources": {"hardware": target.stem}}, display_path(target), "preset", {})
                self.layers.append(hw)
                continue
            self.read(target, [*stack, target])
        self.layers.append(layer)
        layer.data["__extends__"] = extends
        return layer

    def _extends_list(self, raw: Any, layer: Layer) -> list[str]:
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            self.problems.append(
                Problem(
                    "error",
                    "extends-type",
                    "extends must be a list of strings",
                    "extends",
                    layer.source,
                    layer.lines.get("extends"),
                )
            )
            return []
        out: list[str] = []
        for item in raw:
            try:
                out.append(expand(item, self.env)[0])
            except EnvExpansionError as e:
                self.problems.append(
                    Problem("error", "env-unset", str(e), "extends", layer.source, layer.lines.get("extends"))
                )
        return out

    def _resolve_ref(self, ref: str, parent: Path, layer: Layer) -> Path | None:
        line = layer.lines.get("extends")
        if ref.endswith(".toml") or ref.startswith((".", "/", "~")):
            p = Path(os.path.expanduser(ref))
            p = p if p.is_absolute() else parent.parent / p
            if not p.is_file():
                self.problems.append(
                    Problem(
                        "error",
                        "extends-missing",
                        f"extended file not found: {ref}",
                        "extends",
                        layer.source,
                        line,
                        hint=f"looked at {p}",
                    )
                )
                return None
            return p
        matches = find_preset(ref)
        if len(matches) == 1:
            return matches[0].path
        if len(matches) > 1:
            names = ", ".join(m.ref for m in matches)
            self.problems.append(
                Problem(
                    "error",
                    "extends-ambiguous",
                    f"preset {ref!r} is ambiguous: {names}",
                    "extends",
                    layer.source,
                    line,
                    hint="write kind/name",
                )
            )
            return None
        close = difflib.get_close_matches(
            ref, preset_names() + [n.split("/")[1] for n in preset_names()], n=3, cutoff=0.6
        )
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "see `asyncrl presets list`"
        self.problems.append(
            Problem(
                "error",
                "extends-unknown",
                f"unknown preset {ref!r}",
                "extends",
                layer.source,
                line,
                hint=hint,
            )
        )
        return None


def _kind_of(path: Path) -> str | None:
    from asyncrl_cli.config.catalog import KINDS, presets_dir

    try:
        rel = path.resolve().relative_to(presets_dir().resolve())
    except ValueError:
        return None
    return rel.parts[0] if rel.parts and rel.parts[0] in KINDS else None


def _is_preset(path: Path) -> bool:
    return _kind_of(path) is not None


def _apply_rc_preset(merged: dict[str, Any], prov: Provenance) -> None:
    """Fill `algorithm.rollout_correction` keys from its `preset`, under the keys set explicitly."""
    rc = get_path(merged, RC_KEY)
    if not isinstance(rc, dict) or not isinstance(rc.get("preset"), str):
        return
    name = canonical_preset_name(rc["preset"])
    if name not in RC_PRESETS:
        return  # the schema reports the unknown name
    src = prov.get(f"{RC_KEY}.preset")
    for k, v in RC_PRESETS[name].items():
        if k in rc:
            continue
        rc[k] = v
        prov.origins[f"{RC_KEY}.{k}"] = Origin(
            "preset", src.source, src.line, (), f"rollout-correction preset {name}"
        )


def resolve_layers(
    path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> tuple[dict[str, Any] | None, Provenance, list[Problem]]:
    """Merge `path`, its `extends` chain and `overrides` into one raw dict (None if the root file cannot
    be parsed); return it with the provenance and every problem found. Raises OverrideError only."""
    env = os.environ if env is None else env
    parsed = [parse_override(o) for o in overrides]
    root = Path(path)
    res = _Resolver(env)
    prov = Provenance(root=display_path(root))
    root_layer = res.read(root, [root])
    if root_layer is None:
        return None, prov, res.problems
    merged: dict[str, Any] = {}
    for layer in res.layers:
        extends = layer.data.pop("__extends__", None)
        _merge(merged, layer.data, layer, prov)
        prov.files.append(layer.source)
        if layer is root_layer:
            merged["extends"] = extends or []
            if extends:
                prov.origins["extends"] = layer.origin("extends")
    set_layer = Layer({}, "--set", "set")
    for key, value in parsed:
        sub: dict[str, Any] = {}
        set_path(sub, key, value)
        sub = _expand_tree(sub, "", set_layer, env, res.problems)
        _merge(merged, sub, set_layer, prov)
    _apply_rc_preset(merged, prov)
    return merged, prov, res.problems
