"""docs/benchmarks.md, generated from `benchmarks/results/*.json` (plus the hand-written analysis in
`benchmarks/commentary/<study>.md`, when present, and the dated measurements of `benchmarks/notes/*.md`, which
are not studies: appended as they are). Never edit the generated file by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import STUDIES
from benchmarks.common import QUIET_LOAD, REPO, RESULTS_DIR
from benchmarks.targets import describe

DOCS = REPO / "docs" / "benchmarks.md"
COMMENTARY = REPO / "benchmarks" / "commentary"
NOTES = REPO / "benchmarks" / "notes"
TITLES = {
    "async-vs-sync": "1. Async vs sync",
    "rollout-throughput": "2. Rollout throughput",
    "weight-sync": "3. Weight sync",
    "trainer-throughput": "4. Trainer throughput",
    "cli-latency": "5. CLI latency",
    "staleness": "6. Staleness vs speed",
    "plan-validation": "7. Plan validation: `asyncrl plan` against measured runs",
    "trl-grpo": "8. TRL GRPOTrainer side by side",
    "precision": "9. Precision per role",
    "demo-sweep": "10. Demo recipe sweep",
    "memory-model": "11. Memory model: activation terms measured",
    "tool-use": "12. Tool use: SmolLM2 with and without a calculator",
    "long-row": "13. Long row: recompute and token budgets at the 7B width",
    "elastic-cores": "14. Elastic cores: async ÷ sync with and without lending",
    "demo-seeds": "15. The demo as `make demo` runs it, three seeds",
    "shared-prompt": "16. Shared-prompt forward: a group's prompt once",
    "sandbox-overhead": "17. Tool sandbox overhead: a call through bubblewrap",
    "packing": "18. Packed rows: the demo's padding removed",
}


REPORTED_SIZES = ("full", "seeds")  # `seeds`: a study repeated over seeds (trl-grpo's equal terms)


def load_results(results_dir: Path) -> dict[str, dict[str, Any]]:
    """Reported results by study name: `<study>.json` at a full size (toy and smoke sizes are ignored)."""
    out = {}
    for name in STUDIES:
        path = results_dir / f"{name}.json"
        if path.exists():
            data = json.loads(path.read_text())
            if data.get("size") in REPORTED_SIZES:
                out[name] = data
    return out


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def md_table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def measured_text(t: dict[str, Any]) -> str:
    m = t["measured"]
    if m is None:
        return "—"
    if isinstance(m, bool):
        return "yes" if m else "no"
    if isinstance(m, (list, tuple)):  # a comparison of arms (e.g. the tool-use study's [tool, no tool])
        return " vs ".join("—" if v is None else f"{v:g}" for v in m)
    return f"{m:g}{unit_text(t)}"


def unit_text(t: dict[str, Any]) -> str:
    """A symbol sticks to its number (`1.3×`, `40%`); a word or a letter gets a space (`3 of 3`, `12 s`)."""
    unit = t.get("unit") or ""
    return f" {unit}" if unit[:1].isalpha() else unit


def goal_text(t: dict[str, Any]) -> str:
    if t["op"] == "true":
        return "yes"
    if not isinstance(t["goal"], (int, float)):  # a goal named in words (another arm)
        return f"{t['op']} {t['goal']}"
    sym = "≥" if t["op"] == ">=" else "≤"
    return f"{sym} {t['goal']:g}{unit_text(t)}"


def machine_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    latest = max(results.values(), key=lambda r: r["date"])
    m = latest["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    return [
        f"- CPU: {cpu_text(m)}, {m['ram_gib']} GiB RAM, {m['os']}",
        f"- Software: {versions}",
        "- asyncrl commit: each study's own, with its dirty flag, under its heading",
    ]


def cpu_text(m: dict[str, Any]) -> str:
    """`AMD EPYC (avx512_bf16, avx512f, avx2), 2 cores`; the ISA flags are recorded since issue 29."""
    isa = m.get("isa")
    flags = f" ({', '.join(isa) or 'no AMX / AVX-512 / AVX2'})" if isa is not None else " (ISA flags not recorded)"
    return f"{m['cpu']}{flags}, {m['cores']} cores"


def source_text(m: dict[str, Any]) -> str:
    """What code ran: `commit abc1234 (clean tree)`, or the dirty flag with the diff's hash and any correction."""
    commit = f"commit `{m.get('commit') or 'unknown'}`"
    if m.get("dirty") is None:
        state = "tree state not recorded"
    elif m["dirty"]:
        digest = m.get("diff_sha256")
        state = "**dirty tree**" + (f", diff sha256 `{digest}`" if digest else ", diff not recorded")
    else:
        state = "clean tree"
    note = f" — {m['provenance_note']}" if m.get("provenance_note") else ""
    return f"{commit} ({state}){note}"


def load_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    loaded = {
        n: r
        for n, r in results.items()
        if max(r["load_before"][0], r.get("load_after", [0])[0]) >= QUIET_LOAD
    }
    if not loaded:
        return [f"All studies started and ended with a 1-minute load average below {QUIET_LOAD}."]
    names = ", ".join(
        f"{n} ({r['load_before'][0]} → {r.get('load_after', ['?'])[0]})" for n, r in loaded.items()
    )
    return [
        (
            f"**The machine was shared while these ran** (1-minute load at start → end; {QUIET_LOAD} counts as "
            f"quiet on this machine): {names}. Other engineers' tests were competing for the same cores, so "
            "absolute timings are noisy and likely pessimistic; ratios measured within one study are more "
            "trustworthy than absolute numbers."
        )
    ]


def study_section(name: str, r: dict[str, Any]) -> list[str]:
    dirty = " (ran from a dirty tree)" if r["machine"].get("dirty") else ""
    lines = [f"## {TITLES.get(name, name)}{dirty}", ""]
    lines.append(
        f"`{r['command']}` (or `asyncrl bench {name}`) · {r['date']} · load {r['load_before']} → "
        f"{r.get('load_after')} · took {r.get('study_wall_s')} s"
    )
    lines += ["", f"Ran from {source_text(r['machine'])} · CPU {cpu_text(r['machine'])}", ""]
    for t in r["tables"]:
        lines += [f"**{t['title']}**", "", *md_table(t["columns"], t["rows"]), ""]
    if r["targets"]:
        lines += ["**Targets**", ""]
        lines += md_table(
            ["target", "measured", "goal", "result"],
            [[t["target"], measured_text(t), goal_text(t), describe(t)] for t in r["targets"]],
        )
        lines.append("")
    lines += [f"![{name}](../benchmarks/results/{name}.png)", ""]
    if r["notes"]:
        lines += ["Notes:", "", *[f"- {n}" for n in r["notes"]], ""]
    commentary = COMMENTARY / f"{name}.md"
    if commentary.exists():
        lines += ["**What limits it**", "", commentary.read_text().strip(), ""]
    return lines


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m benchmarks report` from benchmarks/results/*.json; do not edit. -->",
        "",
        (
            "Each study is one command; each writes `benchmarks/results/<study>.json` and a plot next to it, "
            "and this page is rebuilt from those files. Rerun any of them on your machine with "
            "`python -m benchmarks <study>` (or `asyncrl bench <study>`); `--toy` runs the seconds-long version "
            "that the smoke test (`tests/benchmarks`) uses. The targets come from issue 8; they are goals, "
            "not test assertions. `benchmarks/results/` keeps only each study's current JSON and plot "
            "(`make lint` checks it: scripts/check_results.py); earlier and exploratory results are in git history, "
            "cited where a study quotes them."
        ),
        "",
    ]
    if not results:
        return "\n".join([*lines, "No full-size results yet: run `python -m benchmarks all`.", ""])
    lines += [
        "## Machine",
        "",
        *machine_lines(results),
        "",
        *load_lines(results),
        "",
        "## Targets at a glance",
        "",
    ]
    rows = [
        [TITLES.get(n, n), t["target"], measured_text(t), goal_text(t), describe(t)]
        for n, r in results.items()
        for t in r["targets"]
    ]
    lines += [*md_table(["study", "target", "measured", "goal", "result"], rows), ""]
    missing = [n for n in STUDIES if n not in results]
    if missing:
        lines += [f"Not run yet: {', '.join(missing)}.", ""]
    for name in STUDIES:
        if name in results:
            lines += study_section(name, results[name])
        elif (COMMENTARY / f"{name}.md").exists():  # not run at full size yet: its method (and any smoke)
            lines += [f"## {TITLES.get(name, name)}", "",
                      f"Not run at full size yet: `python -m benchmarks {name}`.", "",
                      (COMMENTARY / f"{name}.md").read_text().strip(), ""]
    for note in sorted(NOTES.glob("*.md")):
        lines += [note.read_text().strip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def stale_report(results_dir: Path = RESULTS_DIR, docs: Path | None = None) -> str | None:
    """None when `docs` (default docs/benchmarks.md) is exactly what `render` makes of the results and notes;
    else one line naming the first line that differs (a hand edit, lost at the next study's rewrite)."""
    path = docs or DOCS
    want = render(load_results(results_dir)).splitlines()
    have = path.read_text().splitlines() if path.exists() else []
    if want == have:
        return None
    first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
    return (f"{path}: line {first + 1} differs from the generated page (the page is rebuilt from "
            f"benchmarks/results, benchmarks/commentary and benchmarks/notes: put hand-written sections in "
            f"benchmarks/notes/*.md, then run `python -m benchmarks report`)")


def write_report(results_dir: Path = RESULTS_DIR, docs: Path | None = None) -> Path:
    path = docs or DOCS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(load_results(results_dir)))
    return path
