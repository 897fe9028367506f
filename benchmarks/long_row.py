"""Study — one long row on the 7B width: what recompute and token-budget micro-batches do to the measured peak
and to the step time (issue 23's last target: "cut the measured peak of a 28k-token row on the 7B slice by ≥ 4×
at ≤ 1.4× the step time").

The slice: L decoder layers of HF Qwen2 at Qwen2.5-7B's real width (`memory_model.Q7B`: hidden 3584,
intermediate 18944, 28 query / 4 KV heads), bf16 weights with preallocated bf16 gradients, a 256-token
vocabulary, the loss the mean square of the last hidden state — the slices of the `memory-model` study, built,
run and measured by its own code (`memory_model._build`, `_pass`, `measure`: a fresh subprocess with
`MALLOC_MMAP_THRESHOLD_=65536`, the kernel's peak resident size `VmHWM` reset before each step):

    static           resident after building the slice and a warm-up pass, minus resident before it
    activation peak  VmHWM during one step − resident just before it (the step's forward/backward micro-batches)
    total peak       static + activation peak
    step time        wall time of the step, `repeats` times; modes alternate A B B A … inside one process, so
                     load drift hits them alike, and each ratio is taken within a repeat

Modes, as the trainer runs them:

    plain                one micro-batch, every layer's activations kept for the backward
    recompute            `trainer.enable_gradient_checkpointing`: `engine.trainer.torch_trainer.enable_recompute`
                         (HF's per-layer checkpointing; each layer is re-run in the backward)
    padded               the long row and `short` shorter rows right-padded into one micro-batch, plain
    recompute + budget   the same rows in the token-budget micro-batches of `trainer.use_dynamic_bsz`
                         (`engine.trainer.minibatch.micro_batch_count` / `token_budget_micro_batches`, budget = the
                         long row's length, the least `ppo_max_token_len_per_gpu` that `validate` allows), each
                         padded to its own longest row, with recompute

The one-row modes run at two lengths T1 < T2 (the plain path fits both with ≥ 5 GiB to spare), so the study
shows the activation peak is linear in T (slope per mode) and extrapolates — labelled as such — to 28k tokens,
the length the target names, which this machine cannot run plain (the RAM it needs is printed next to it).

    python -m benchmarks long-row          # ~30 min on 2 cores; writes benchmarks/results/long-row.json
    python -m benchmarks long-row --toy    # seconds: a 512-wide slice (the smoke test)
    python -m benchmarks.long_row --check-28k 2   # the 28k row itself on a 2-layer slice (~14 min; 1: ~6 min; a temp dir)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import default_out_dir, finish_result, new_result, publish, table, write_json
from benchmarks.memory_model import Q7B, _build, _pass, _reset_peak, _Shape, _status, measure, predict
from benchmarks.plots import pyplot, save
from benchmarks.targets import evaluate

STUDY = "long-row"
TARGET_TOKENS = 28672
"""The target's row: 28k tokens (the 7B preset's prompt + response budget)."""
FULL_DEPTH = 28
"""Qwen2.5-7B's decoder layers (the extrapolation to the whole model's depth)."""
GOAL_CUT, GOAL_TIME = 4.0, 1.4
TOY = {"kind": "dense", "hidden": 512, "intermediate": 2048, "heads": 8, "kv_heads": 2, "head_dim": 64}
SIZES: dict[str, dict[str, Any]] = {
    # tokens: (T1, T2); the padded / budget step is the T1 row with `short` rows of T1 // 4 tokens
    "toy": {"shape": TOY, "layers": 2, "tokens": (128, 256), "short": 3, "repeats": 2, "threads": 1,
            "timeout_s": 300},
    "full": {"shape": Q7B, "layers": 8, "tokens": (1536, 3072), "short": 3, "repeats": 3, "threads": 2,
             "timeout_s": 3600},
}


# --- the worker: one slice, several step cases, in its own process ----------------------------------------------
def _set_recompute(model: Any, on: bool) -> None:
    from engine.trainer.torch_trainer import enable_recompute

    if on:
        enable_recompute(model)
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def _measure_cases(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the slice once, then run each case's step `repeats` times (order A B … B A …: every case's i-th
    step sits at the same distance from the middle of the run); bytes and seconds."""
    import torch
    import transformers  # noqa: F401  (imported before the baseline: its modules are not the slice's memory)
    from transformers import Qwen2ForCausalLM  # noqa: F401

    load_start = [round(x, 2) for x in os.getloadavg()]
    before = _status("VmRSS")
    started = time.monotonic()
    model = _build(spec)
    model.train()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for on in (True, False):  # one small warm-up step per mode
        _set_recompute(model, on)
        _pass(model, [8])
    static = _status("VmRSS") - before
    build_s = time.monotonic() - started
    cases = [{**c, "peaks": [], "seconds": []} for c in spec["cases"]]
    for rep in range(spec["repeats"]):
        for case in cases if rep % 2 == 0 else cases[::-1]:
            _set_recompute(model, case["recompute"])
            base = _status("VmRSS")
            _reset_peak()
            t0 = time.perf_counter()
            for micro in case["micro_batches"]:
                _pass(model, micro)
            case["seconds"].append(round(time.perf_counter() - t0, 3))
            case["peaks"].append(_status("VmHWM") - base)
    return {"static": static, "params": sum(p.numel() for p in model.parameters()), "build_s": round(build_s, 1),
            "cases": cases, "load": [load_start, [round(x, 2) for x in os.getloadavg()]]}


# --- the study ---------------------------------------------------------------------------------------------------
def step_cases(t1: int, t2: int, short: int) -> list[dict[str, Any]]:
    """The cases of the study's one process: a row of t1 and of t2 tokens, plain and with recompute, and the
    t1 row with `short` rows of t1 // 4 tokens, padded into one micro-batch vs the trainer's token-budget
    micro-batches (budget t1) with recompute."""
    from engine.trainer.minibatch import micro_batch_count, token_budget_micro_batches

    cases = [{"name": name, "tokens": t, "recompute": name == "recompute", "micro_batches": [[t]]}
             for t in (t1, t2) for name in ("plain", "recompute")]
    lengths = [t1] + [t1 // 4] * short
    groups = token_budget_micro_batches(lengths, micro_batch_count(lengths, t1))
    cases += [{"name": "padded", "tokens": t1, "recompute": False, "micro_batches": [lengths]},
              {"name": "recompute + budget", "tokens": t1, "recompute": True,
               "micro_batches": [[lengths[i] for i in g] for g in groups]}]
    return cases


def _peak(case: dict[str, Any]) -> float:
    """A case's activation peak: the median over its repeats (the first step of a shape may allocate a little
    more — caches, heap growth; the spread is kept in the JSON)."""
    return statistics.median(case["peaks"])


def _median_range(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _fmt_range(xs: list[float], digits: int = 1) -> str:
    med, lo, hi = _median_range(xs)
    return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def _ratios(num: dict[str, Any], den: dict[str, Any]) -> list[float]:
    """Per-repeat step-time ratios num ÷ den (both ran in the same repeat, back to back)."""
    return [a / b for a, b in zip(num["seconds"], den["seconds"])]


def attention_share(tokens: float, spec: dict[str, Any]) -> float:
    """FLOPs of a step at `tokens` relative to its matmuls alone: 1 + causal attention (QKᵀ and PV, half the
    T×T square) over the weight matmuls (2 FLOPs per parameter per token) — for scaling times to other T."""
    shape = _Shape(spec)
    from engine.plan.memory import layer_params

    return 1 + (tokens * shape.heads * shape.head_dim * 2) / (2 * layer_params(shape))


def run(size_name: str, out_dir: Path) -> dict[str, Any]:
    from engine.plan.memory import calibration

    started = time.monotonic()
    size = SIZES["toy" if size_name == "toy" else "full"]
    t1, t2 = size["tokens"]
    layers, shape = size["layers"], size["shape"]
    result = new_result(STUDY, size_name, {k: v for k, v in size.items() if k != "timeout_s"})
    spec = {**shape, "layers": layers, "repeats": size["repeats"], "cases": step_cases(t1, t2, size["short"])}
    meas = measure(spec, module="benchmarks.long_row", threads=size["threads"], timeout_s=size["timeout_s"])
    result["measurements"] = meas
    cal = calibration()
    gib = 2**30
    by = {(c["tokens"], c["name"]): {**c, "static": meas["static"], "params": meas["params"]}
          for c in meas["cases"]}

    # one long row, both lengths
    rows_single, cuts = [], {}
    for tokens in (t1, t2):
        plain, rec = by[(tokens, "plain")], by[(tokens, "recompute")]
        for c in (plain, rec):
            _, pred = predict({**shape, "layers": layers, "recompute": c["recompute"],
                               "micro_batches": c["micro_batches"]}, cal, c["params"])
            act = _peak(c)
            rows_single.append([tokens, c["name"], f"{c['static'] / 1e9:.2f}", f"{act / 1e9:.2f}",
                                f"{pred / 1e9:.2f}", f"{(c['static'] + act) / 1e9:.2f}", _fmt_range(c["seconds"])])
        act_p, act_r = _peak(plain), _peak(rec)
        cuts[tokens] = {"activation": act_p / act_r, "total": (plain["static"] + act_p) / (rec["static"] + act_r),
                        "time": _ratios(rec, plain)}
    # slopes and intercepts per mode (bytes per token), the per-layer split
    fits = {}
    for mode in ("plain", "recompute"):
        a1, a2 = _peak(by[(t1, mode)]), _peak(by[(t2, mode)])
        slope = (a2 - a1) / (t2 - t1)
        fits[mode] = {"slope": slope, "intercept": a1 - slope * t1}
    per_layer = fits["plain"]["slope"] / layers  # a: bytes per token per layer, everything kept
    kept = (fits["recompute"]["slope"] - per_layer) / layers  # c: what recompute keeps per token per layer
    static = meas["static"]

    def extrapolate(tokens: int, depth: int) -> dict[str, float]:
        plain = fits["plain"]["intercept"] + tokens * depth * per_layer
        rec = fits["recompute"]["intercept"] + tokens * (depth * kept + per_layer)
        return {"plain": plain, "recompute": rec, "static": static * depth / layers}

    x28, x28_full = extrapolate(TARGET_TOKENS, layers), extrapolate(TARGET_TOKENS, FULL_DEPTH)
    ram = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    # step time at 28k: the T2 measurement scaled by FLOPs (matmuls ∝ T, causal attention ∝ T²)
    scale = (TARGET_TOKENS * attention_share(TARGET_TOKENS, {**shape, "layers": layers})) / (
        t2 * attention_share(t2, {**shape, "layers": layers}))
    t28 = {m: statistics.median(by[(t2, m)]["seconds"]) * scale for m in ("plain", "recompute")}

    # the step of the long row + short rows
    padded, budget = by[(t1, "padded")], by[(t1, "recompute + budget")]
    step_rows = []
    for c in (by[(t1, "plain")], padded, budget):
        computed = sum(len(mb) * max(mb) for mb in c["micro_batches"])
        act = _peak(c)
        step_rows.append([c["name"], " + ".join(f"[{', '.join(map(str, mb))}]" for mb in c["micro_batches"]),
                          computed, f"{act / 1e9:.2f}", f"{(c['static'] + act) / 1e9:.2f}",
                          _fmt_range(c["seconds"])])
    step_act_cut = _peak(padded) / _peak(budget)
    step_total_cut = (padded["static"] + _peak(padded)) / (budget["static"] + _peak(budget))
    step_time = _ratios(budget, padded)

    result["derived"] = {
        "cuts": {str(k): v for k, v in cuts.items()}, "fits": fits, "per_token_layer_plain": per_layer,
        "per_token_layer_recompute_kept": kept, "static": static, "ram_bytes": ram,
        "extrapolated_28k_slice": x28, "extrapolated_28k_full_depth": x28_full, "extrapolated_28k_step_s": t28,
        "budget_step": {"activation_cut": step_act_cut, "total_cut": step_total_cut, "time_ratio": step_time},
    }
    cut_rows = [[t, f"{c['activation']:.2f}×", f"{c['total']:.2f}×", _fmt_range(c["time"], 2)]
                for t, c in cuts.items()]
    cut_rows.append(["padded → recompute + budget (row + short rows)", f"{step_act_cut:.2f}×",
                     f"{step_total_cut:.2f}×", _fmt_range(step_time, 2)])
    long_plain = by[(t1, "plain")]
    cut_rows.append(["padded → budget alone, plain (inferred: its heaviest micro-batch is the long row, `plain`)",
                     f"{_peak(padded) / _peak(long_plain):.2f}×",
                     f"{(padded['static'] + _peak(padded)) / (long_plain['static'] + _peak(long_plain)):.2f}×",
                     "—"])
    gb = lambda b: f"{b / 1e9:.1f}"  # noqa: E731
    result["tables"] = [
        table(f"One long row, {layers} layers at {shape['hidden']} / {shape['intermediate']} (GB; step s: median "
              f"(min–max) of {size['repeats']})",
              ["tokens", "mode", "static", "activation peak", "memory model's activations", "total peak",
               "step s"], rows_single),
        table("Cut (plain ÷ recompute; padded ÷ recompute + budget) and step-time ratio (per repeat, median (min–max))",
              ["tokens", "activation peak cut", "total peak cut", "step time ratio"], cut_rows),
        table("Linear in T: activation peak = intercept + slope × T (from T1, T2)",
              ["mode", "slope, kB per token", "per token per layer, kB", "intercept GB", "memory model, kB/token"],
              [["plain", f"{fits['plain']['slope'] / 1e3:.0f}", f"{per_layer / 1e3:.1f}",
                f"{fits['plain']['intercept'] / 1e9:.2f}", f"{_model_slope(shape, layers, False, cal) / 1e3:.0f}"],
               ["recompute", f"{fits['recompute']['slope'] / 1e3:.0f}", f"{kept / 1e3:.1f} kept + one layer's",
                f"{fits['recompute']['intercept'] / 1e9:.2f}",
                f"{_model_slope(shape, layers, True, cal) / 1e3:.0f}"]]),
        table(f"Long row + {size['short']} short rows, one step (T1 = {t1})",
              ["case", "micro-batches (row tokens)", "tokens computed", "activation peak GB", "total peak GB",
               "step s"], step_rows),
        table(f"EXTRAPOLATION (not measured) to a {TARGET_TOKENS}-token row from the measured slopes (GB; RAM here "
              f"{ram / 1e9:.1f} GB)",
              ["depth", "static", "plain act.", "recompute act.", "plain total", "recompute total",
               "activation cut", "total cut"],
              [[f"{d} layers", gb(x["static"]), gb(x["plain"]), gb(x["recompute"]), gb(x["static"] + x["plain"]),
                gb(x["static"] + x["recompute"]), f"{x['plain'] / x['recompute']:.2f}×",
                f"{(x['static'] + x['plain']) / (x['static'] + x['recompute']):.2f}×"]
               for d, x in ((layers, x28), (FULL_DEPTH, x28_full))]),
    ]
    time_ratio = statistics.median(cuts[t2]["time"])
    result["targets"] = [
        evaluate(f"activation peak cut, one {t2}-token row, {layers} layers (measured)",
                 round(cuts[t2]["activation"], 2), GOAL_CUT, ">=", "×"),
        evaluate(f"step time, recompute ÷ plain, {t2}-token row (median of {size['repeats']})",
                 round(time_ratio, 3), GOAL_TIME, "<=", "×"),
        evaluate(f"activation peak cut, {TARGET_TOKENS}-token row, {layers} layers (extrapolated)",
                 round(x28["plain"] / x28["recompute"], 2), GOAL_CUT, ">=", "×"),
        evaluate(f"activation peak cut, {TARGET_TOKENS}-token row measured", None, GOAL_CUT, ">=", "×",
                 why_missing=f"plain needs ~{(x28['static'] + x28['plain']) / 1e9:.0f} GB here "
                             f"(RAM {ram / 1e9:.0f} GB) and ~{t28['plain'] / 60:.0f} min per step"),
    ]
    result["notes"] = [
        f"One process: the slice built in {meas['build_s']} s, everything took {meas['seconds']} s; load in it "
        f"{meas['load'][0]} → {meas['load'][1]}; {size['threads']} intra-op thread(s)"]

    def draw() -> None:
        plt = pyplot()
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
        xs = [0, t2 * 1.5, TARGET_TOKENS]
        for mode, color in (("plain", "tab:red"), ("recompute", "tab:blue")):
            f = fits[mode]
            ax.plot([t1, t2], [_peak(by[(t, mode)]) / gib for t in (t1, t2)], "o", color=color,
                    label=f"{mode} (measured)")
            ax.plot(xs, [(f["intercept"] + f["slope"] * x) / gib for x in xs], "--", color=color, linewidth=1,
                    label=f"{mode} (extrapolated)")
        ax.axhline((ram - static) / gib, color="grey", linewidth=1, label="RAM − static")
        ax.set_xlabel("tokens in the row")
        ax.set_ylabel("activation peak, GiB")
        ax.set_title(f"One row, {layers} layers at the 7B width" if shape is Q7B else "One row (toy width)",
                     fontsize=10)
        ax.legend(fontsize=7)
        names = [(t1, "plain"), (t1, "recompute"), (t2, "plain"), (t2, "recompute"), (t1, "padded"),
                 (t1, "recompute + budget")]
        meds = [statistics.median(by[k]["seconds"]) for k in names]
        err = [[m - min(by[k]["seconds"]) for m, k in zip(meds, names)],
               [max(by[k]["seconds"]) - m for m, k in zip(meds, names)]]
        bx.bar(range(len(names)), meds, yerr=err, color=["tab:red", "tab:blue"] * 2 + ["tab:orange", "tab:green"])
        bx.set_xticks(range(len(names)), [n.replace(" + ", "\n+ ") + f"\nT={t}" for t, n in names], fontsize=7)
        bx.set_ylabel("step s (median, min–max)")
        bx.set_title("Step time", fontsize=10)
        save(fig, out_dir, STUDY)

    return publish(result, started, out_dir, draw)


def _model_slope(shape: dict[str, Any], layers: int, recompute: bool, cal: dict[str, Any]) -> float:
    """The memory model's activation bytes per token of a row through the slice."""
    from engine.plan.memory import activation_bytes

    return activation_bytes(_Shape({**shape, "layers": layers}), 1, layers, recompute, 2, cal)


def check_target_length(out_dir: Path, layers: int = 2, tokens: int = TARGET_TOKENS, threads: int = 2,
                        shape: dict[str, Any] = Q7B) -> Path:
    """The target's length itself on a slice shallow enough to run plain here (2 layers at the 7B width: ~15 GB):
    one step per mode, to check the per-layer slopes that the study extrapolates to 28k tokens; two depths (1 and
    2 layers) give the per-layer cost at 28k itself. Writes `<out_dir>/long-row-28k-<layers>l.json` (not a
    registered study, so not kept in benchmarks/results: the `long-row` commentary quotes its numbers)."""
    started = time.monotonic()
    result = new_result("long-row-28k", "full", {"shape": shape, "layers": layers, "tokens": tokens,
                                                  "threads": threads})
    result["command"] = f"python -m benchmarks.long_row --check-28k {layers}"
    cases = [{"name": n, "tokens": tokens, "recompute": n == "recompute", "micro_batches": [[tokens]]}
             for n in ("plain", "recompute")]
    meas = measure({**shape, "layers": layers, "repeats": 1, "cases": cases}, module="benchmarks.long_row",
                   threads=threads, timeout_s=3000)
    result["measurements"] = meas
    peak = {c["name"]: c["peaks"][0] for c in meas["cases"]}
    result["derived"] = {"activation_cut": peak["plain"] / peak["recompute"],
                         "per_token_per_layer_plain": peak["plain"] / tokens / layers}
    result["tables"] = [table(f"One {tokens}-token row, {layers} layers at {shape['hidden']} / "
                              f"{shape['intermediate']} (measured)",
                              ["mode", "static GB", "activation peak GB", "total peak GB", "step s"],
                              [[c["name"], f"{meas['static'] / 1e9:.2f}", f"{c['peaks'][0] / 1e9:.2f}",
                                f"{(meas['static'] + c['peaks'][0]) / 1e9:.2f}", c["seconds"][0]]
                               for c in meas["cases"]])]
    finish_result(result, started)
    written = write_json(result, out_dir)
    return written.rename(written.with_name(f"long-row-28k-{layers}l.json"))


if __name__ == "__main__":
    if sys.argv[1] == "--check-28k":  # python -m benchmarks.long_row --check-28k [LAYERS]
        print(check_target_length(default_out_dir("check-28k"), layers=int(sys.argv[2]) if len(sys.argv) > 2 else 2))
    else:
        print(json.dumps(_measure_cases(json.loads(sys.argv[1]))))
