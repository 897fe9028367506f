"""Study — the memory model's activation terms, measured: peak memory of real forward/backward passes of 2–4-layer
slices of HF Qwen2 (dense) and Qwen3-MoE at the presets' real widths, on this CPU, with and without HF's
`gradient_checkpointing_enable()`; the coefficients of `engine.plan.memory` fitted on some, checked on others.

What is measured, and why that way: torch's CPU allocator is glibc malloc, which has no peak counter
(`torch.cuda.max_memory_allocated` has no CPU twin) and tracemalloc does not see tensor storage. Each measurement
therefore runs in a fresh subprocess with `MALLOC_MMAP_THRESHOLD_=65536` (every tensor buffer is its own mmap,
returned to the OS when freed, so resident memory tracks live tensor bytes) and reads the kernel's peak resident
size `VmHWM`, reset (`/proc/self/clear_refs` ← 5) just before the measured pass:

    static    = resident after building the slice (bf16 weights, zero bf16 gradients) and one warm-up pass,
                minus resident before building it
    activation peak = VmHWM during the measured pass − resident before it

A slice is `layers` decoder layers at the real hidden/intermediate/head sizes, a small vocabulary (the head is
measured on its own, at Qwen2.5's real 152,064-token vocabulary, through `engine.trainer.logprobs`), and for
MoE 16 experts instead of 128 (activations depend on top-k and the expert width, not on the expert count).
The loss is the mean square of the last hidden state. Coefficients (module docstring of `engine.plan.memory`):
per-token slopes from two token counts per shape, so constants (allocator, the warm-up's buffers) cancel:

    dense 7B width and 8B width, recompute off → c_h, c_i (two equations)
    MoE 30B-A3B width, off → c_m;   dense 7B width, recompute on → c_ck;   intercepts → c_t;   head → c_v

Held-out configs (other widths, token counts, layer counts, recompute, token-budget micro-batches vs fixed
ones) are predicted with the fitted table through the same functions `validate` uses, against the measured peak
(static + activation peak); target: within 15 %.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import new_result, publish, table
from benchmarks.plots import pyplot, save
from benchmarks.targets import evaluate

STUDY = "memory-model"
CALIBRATION_OUT = Path(__file__).resolve().parents[1] / "engine" / "plan" / "_calibration" / "activations.json"

Q7B = {"kind": "dense", "hidden": 3584, "intermediate": 18944, "heads": 28, "kv_heads": 4, "head_dim": 128}
Q8B = {"kind": "dense", "hidden": 4096, "intermediate": 12288, "heads": 32, "kv_heads": 8, "head_dim": 128}
Q1_5B = {"kind": "dense", "hidden": 1536, "intermediate": 8960, "heads": 12, "kv_heads": 2, "head_dim": 128}
A3B = {"kind": "moe", "hidden": 2048, "intermediate": 6144, "heads": 32, "kv_heads": 4, "head_dim": 128,
       "experts": 16, "top_k": 8, "moe_intermediate": 768}
MOE_K4 = {**A3B, "top_k": 4, "moe_intermediate": 1536}
SIZES = {
    # (fit token counts, held-out scale): `toy` keeps every pass to a second or two
    "toy": {"tokens": (32, 64), "scale": 0.125, "dense": Q1_5B, "dense2": {**Q1_5B, "intermediate": 4480},
            "moe": {**A3B, "hidden": 512}, "head_vocab": 8192},
    "full": {"tokens": (128, 384), "scale": 1.0, "dense": Q7B, "dense2": Q8B, "moe": A3B, "head_vocab": 152064},
}


# --- one measurement, in its own process ---------------------------------------------------------------------
def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _build(spec: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3MoeConfig

    common = {"vocab_size": 256, "hidden_size": spec["hidden"], "num_hidden_layers": spec["layers"],
              "num_attention_heads": spec["heads"], "num_key_value_heads": spec["kv_heads"],
              "tie_word_embeddings": False, "attn_implementation": "sdpa"}
    if spec["kind"] == "moe":
        cfg = Qwen3MoeConfig(**common, head_dim=spec["head_dim"], intermediate_size=spec["intermediate"],
                             num_experts=spec["experts"], num_experts_per_tok=spec["top_k"],
                             moe_intermediate_size=spec["moe_intermediate"])
    else:
        cfg = Qwen2Config(**common, intermediate_size=spec["intermediate"])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)


def _pass(model: Any, lengths: list[int]) -> None:
    """Forward + backward of one micro-batch of rows of `lengths` tokens, right-padded to the longest."""
    import torch

    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = torch.randint(0, 256, (len(lengths), width)) * mask
    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                         use_cache=False).last_hidden_state
    hidden.float().square().mean().backward()


def _measure_slice(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers  # noqa: F401  (imported before the baseline: its modules are not the slice's memory)
    from transformers import Qwen2ForCausalLM, Qwen3MoeForCausalLM  # noqa: F401

    before = _status("VmRSS")
    model = _build(spec)
    if spec.get("recompute"):
        model.gradient_checkpointing_enable()
    model.train()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    _pass(model, [8])
    static = _status("VmRSS") - before
    peaks = []
    for micro in spec["micro_batches"]:
        base = _status("VmRSS")
        _reset_peak()
        _pass(model, micro)
        peaks.append(_status("VmHWM") - base)
    params = sum(p.numel() for p in model.parameters())
    return {"static": static, "activation_peak": max(peaks), "params": params}


def _measure_head(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from engine.trainer.logprobs import token_log_probs

    tokens, vocab = spec["tokens"], spec["vocab"]
    logits = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    logits.grad = torch.zeros_like(logits)
    ids = torch.randint(0, vocab, (1, tokens))
    base = _status("VmRSS")
    _reset_peak()
    picked, _ = token_log_probs(logits, ids, 1.0)
    picked.sum().backward()
    return {"static": 0, "activation_peak": _status("VmHWM") - base, "params": 0}


def measure(spec: dict[str, Any], *, module: str = "benchmarks.memory_model", threads: int = 1,
            timeout_s: float = 600) -> dict[str, Any]:
    """Run one measurement in a fresh subprocess (see the module docstring); its bytes and seconds. `module` is
    the worker (`python -m module SPEC` prints one JSON line; the long-row study has its own), `threads` its
    intra-op threads."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", module, json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=timeout_s, check=False)
    if out.returncode:
        raise RuntimeError(f"measurement {spec} failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "seconds": round(time.monotonic() - start, 1)}


# --- fit and check ----------------------------------------------------------------------------------------------
class _Shape:
    """A slice's shape in `engine.plan.memory.ModelShape` terms."""

    def __init__(self, spec: dict[str, Any]) -> None:
        moe = spec["kind"] == "moe"
        self.layers, self.hidden, self.heads = spec["layers"], spec["hidden"], spec["heads"]
        self.kv_heads, self.head_dim, self.intermediate = spec["kv_heads"], spec["head_dim"], spec["intermediate"]
        self.vocab, self.experts = 256, spec.get("experts", 0) if moe else 0
        self.experts_per_token = spec.get("top_k", 0) if moe else 0
        self.moe_intermediate = spec.get("moe_intermediate", 0) if moe else 0
        self.moe_layers = self.layers if moe else 0
        self.params_total, self.is_moe, self.params_expert = 0, moe, 0


def _slope(a: dict[str, Any], b: dict[str, Any], ta: int, tb: int) -> float:
    return (b["activation_peak"] - a["activation_peak"]) / (tb - ta)


def fit(size: dict[str, Any], log: list[dict[str, Any]]) -> dict[str, Any]:
    """Measure the fit configs and solve for the coefficients."""
    t1, t2 = size["tokens"]

    def pair(shape: dict[str, Any], recompute: bool, name: str) -> tuple[float, dict[str, Any]]:
        spec = {**shape, "layers": 2, "recompute": recompute}
        m1, m2 = (measure({**spec, "micro_batches": [[t]]}) for t in (t1, t2))
        log.extend({"name": f"{name} T={t}", "role": "fit", **m} for t, m in ((t1, m1), (t2, m2)))
        return _slope(m1, m2, t1, t2) / 2, {"m1": m1, "m2": m2, "spec": spec}

    d1, d2, moe = size["dense"], size["dense2"], size["moe"]
    s1, f1 = pair(d1, False, "dense A")
    s2, f2 = pair(d2, False, "dense B")
    # s = c_h·h + c_i·I (bytes per token per layer at bf16)
    det = d1["hidden"] * d2["intermediate"] - d2["hidden"] * d1["intermediate"]
    c_h = (s1 * d2["intermediate"] - s2 * d1["intermediate"]) / det
    c_i = (d1["hidden"] * s2 - d2["hidden"] * s1) / det
    sm, fm = pair(moe, False, "MoE")
    c_m = (sm - c_h * moe["hidden"]) / (moe["top_k"] * moe["moe_intermediate"])
    sr, _ = pair(d1, True, "dense A recompute")
    # recompute, 2 layers: slope = 2·c_ck·h + (c_h·h + c_i·I), per layer = half of that
    c_ck = (2 * sr - (c_h * d1["hidden"] + c_i * d1["intermediate"])) / (2 * d1["hidden"])
    intercepts = []
    for f in (f1, f2, fm):
        shape = _Shape(f["spec"])
        from engine.plan.memory import layer_params

        a = f["m1"]["activation_peak"] - t1 * 2 * _slope(f["m1"], f["m2"], t1, t2) / 2
        intercepts.append(max(a, 0.0) / (layer_params(shape) * 2))
    c_t = sum(intercepts) / len(intercepts)
    v = size["head_vocab"]
    h1, h2 = (measure({"kind": "head", "tokens": t // 4, "vocab": v}) for t in (t1, t2))
    log.extend({"name": f"head V={v} T={t // 4}", "role": "fit", **m} for t, m in ((t1, h1), (t2, h2)))
    c_v = (h2["activation_peak"] - h1["activation_peak"]) / ((t2 - t1) // 4) / v
    return {"c_h": c_h, "c_i": c_i, "c_m": c_m, "c_ck": c_ck, "c_t": c_t, "c_v": c_v}


def heldout_specs(size: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Configs the coefficients were not fitted on."""
    s = size["scale"]
    n = lambda t: max(8, int(t * s))  # noqa: E731
    rows = [n(40), n(380), n(120), n(300), n(60), n(220), n(350), n(90)]
    return [
        ("dense 1.5B width, 4 layers, 512 tokens", {**Q1_5B, "layers": 4, "micro_batches": [[n(512)]]}),
        ("dense 1.5B width, 4 layers, recompute, 768 tokens",
         {**Q1_5B, "layers": 4, "recompute": True, "micro_batches": [[n(768)]]}),
        ("MoE top-4 × 1536, 2 layers, 320 tokens", {**MOE_K4, "layers": 2, "micro_batches": [[n(320)]]}),
        ("MoE 30B-A3B width, 3 layers, recompute, 320 tokens",
         {**A3B, "layers": 3, "recompute": True, "micro_batches": [[n(320)]]}),
        ("dense 8B width, 2 layers, fixed micro-batches of 4 rows (padded)",
         {**Q8B, "layers": 2, "micro_batches": [rows[:4], rows[4:]]}),
        ("dense 8B width, 2 layers, token budget", {**Q8B, "layers": 2, "budget": n(700), "rows": rows}),
    ]


def predict(spec: dict[str, Any], cal: dict[str, Any], params: int) -> tuple[float, float]:
    """(static, activation peak) the memory model predicts for a slice: bf16 weights + gradients, and the
    largest micro-batch's activations (padded tokens) with the backward transient."""
    from engine.plan.memory import activation_bytes, transient_bytes

    shape = _Shape(spec)
    tokens = max(len(mb) * max(mb) for mb in spec["micro_batches"])
    act = activation_bytes(shape, tokens, spec["layers"], bool(spec.get("recompute")), 2, cal)
    return params * 2 * 2, act + transient_bytes(shape, 2, cal)


def run(size_name: str, out_dir: Path) -> dict[str, Any]:
    from engine.trainer.minibatch import micro_batch_count, token_budget_micro_batches

    started = time.monotonic()
    size = SIZES["toy" if size_name == "toy" else "full"]
    result = new_result(STUDY, size_name, {"fit_tokens": size["tokens"], "dense": size["dense"],
                                           "dense2": size["dense2"], "moe": size["moe"]})
    log: list[dict[str, Any]] = []
    coefficients = fit(size, log)
    cal = {"coefficients": coefficients, "source": f"benchmarks/memory_model.py ({size_name})",
           "date": result["date"], "machine": result["machine"].get("cpu"), "units":
           "bytes per token per layer per unit of width at bf16 compute (c_h, c_i, c_m, c_ck); per layer "
           "parameter (c_t, × compute bytes); per token per vocabulary entry (c_v)"}
    rows, errors = [], []
    for name, spec in heldout_specs(size):
        if "budget" in spec:  # the trainer's own token-budget grouping decides the micro-batches
            lengths = spec.pop("rows")
            groups = token_budget_micro_batches(lengths, micro_batch_count(lengths, spec["budget"]))
            spec["micro_batches"] = [[lengths[i] for i in g] for g in groups]
        m = measure(spec)
        static, act = predict(spec, cal, m["params"])
        measured, predicted = m["static"] + m["activation_peak"], static + act
        err = predicted / measured - 1
        errors.append(abs(err))
        log.append({"name": name, "role": "held-out", **m})
        rows.append([name, f"{m['static'] / 1e9:.3f}", f"{static / 1e9:.3f}", f"{m['activation_peak'] / 1e9:.3f}",
                     f"{act / 1e9:.3f}", f"{measured / 1e9:.3f}", f"{predicted / 1e9:.3f}", f"{100 * err:+.1f} %"])
    if size_name != "toy":
        CALIBRATION_OUT.parent.mkdir(parents=True, exist_ok=True)
        CALIBRATION_OUT.write_text(json.dumps(cal, indent=2) + "\n")
    result["calibration"] = cal
    result["measurements"] = log
    result["tables"] = [
        table("Fitted coefficients (engine/plan/_calibration/activations.json)", ["coefficient", "value"],
              [[k, f"{v:.4g}"] for k, v in coefficients.items()]),
        table("Held-out configs: measured vs predicted peak (GB)",
              ["config", "static meas.", "static pred.", "act. meas.", "act. pred.", "peak meas.", "peak pred.",
               "error"], rows),
        table("Measurements", ["name", "role", "static GB", "activation peak GB", "s"],
              [[r["name"], r["role"], f"{r['static'] / 1e9:.3f}", f"{r['activation_peak'] / 1e9:.3f}",
                r["seconds"]] for r in log]),
    ]
    result["targets"] = [evaluate("held-out peak error (worst of 6)", round(100 * max(errors), 1), 15.0, "<=", "%")]

    def draw() -> None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(9, 4))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [float(r[5]) for r in rows], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [float(r[6]) for r in rows], 0.4, label="predicted")
        ax.set_xticks(list(xs), [r[0][:28] for r in rows], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("peak GB")
        ax.set_title("Memory model: held-out slices, measured vs predicted peak", fontsize=10)
        ax.legend(fontsize=8)
        save(fig, out_dir, STUDY)

    return publish(result, started, out_dir, draw)


def measure_tail(layers: tuple[int, int] = (2, 4), tokens: int = 30720, chunk: int = 4096) -> dict[str, float]:
    """c_tail (`engine.plan.memory_torch`), measured on fake tensors with torch's `MemTracker` (exact tensor
    bytes, as `asyncrl rehearse` counts them; nothing is computed, so a 7B-width slice costs seconds): the forward
    peak of the chunked head over one `tokens`-token row through HF Qwen2 slices at Qwen2.5-7B's width with
    per-layer checkpointing, at two depths. The slope per layer is the checkpointed input (h·2 bytes per token);
    the intercept less the head chunk's forward (`chunk`·V·18 bytes, entropy on) is the tail, per token per unit
    of width. `python -c "from benchmarks.memory_model import measure_tail; print(measure_tail())"`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM, Qwen2Config

    from engine.trainer.logprobs import response_log_probs
    from engine.trainer.torch_trainer import enable_recompute

    h, vocab, prompt = Q7B["hidden"], 152064, 2048
    peaks = []
    for n in layers:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        cfg = Qwen2Config(vocab_size=vocab, hidden_size=h, intermediate_size=Q7B["intermediate"], num_hidden_layers=n,
                          num_attention_heads=Q7B["heads"], num_key_value_heads=Q7B["kv_heads"],
                          tie_word_embeddings=False, attn_implementation="sdpa")
        with mode:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        enable_recompute(model)
        model.train()
        ids = torch.randint(1, 1000, (1, tokens))
        tracker = MemTracker()
        tracker.track_external(model)
        with mode, tracker:
            response_log_probs(model, ids, torch.ones_like(ids), torch.arange(tokens)[None], ids[:, prompt:], 1.0,
                               True, False, chunk_tokens=chunk)
            snap = tracker.get_tracker_snapshot("peak")
        peak = sum(int(v) for d in snap.values() for k, v in d.items() if str(k).endswith("ACT"))
        peaks.append(peak)
    per_layer = (peaks[1] - peaks[0]) / (layers[1] - layers[0])
    intercept = peaks[0] - layers[0] * per_layer
    tail = intercept - chunk * vocab * 18
    return {"per_layer_bytes_per_token_width": per_layer / (tokens * h), "c_tail": tail / (tokens * h),
            "forward_peaks": peaks}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    out = _measure_head(spec) if spec["kind"] == "head" else _measure_slice(spec)
    print(json.dumps(out))
