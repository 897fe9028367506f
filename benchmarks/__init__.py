"""asyncrl's benchmark studies: one module per study, each writing `<name>.json` and `<name>.png`.

Run one with `python -m benchmarks NAME` (or `asyncrl bench NAME`); `python -m benchmarks report` turns the
JSON results into `docs/benchmarks.md`. Study modules are imported lazily, so listing them is cheap.
"""

from __future__ import annotations

STUDIES: dict[str, str] = {
    "async-vs-sync": "benchmarks.async_vs_sync",
    "rollout-throughput": "benchmarks.rollout_throughput",
    "weight-sync": "benchmarks.weight_sync",
    "trainer-throughput": "benchmarks.trainer_throughput",
    "cli-latency": "benchmarks.cli_latency",
    "staleness": "benchmarks.staleness",
    "plan-validation": "benchmarks.plan_validation",
    "trl-grpo": "benchmarks.trl_grpo",
    "precision": "benchmarks.precision",
    "demo-sweep": "benchmarks.demo_sweep",
    "memory-model": "benchmarks.memory_model",
    "tool-use": "benchmarks.tool_use",
    "long-row": "benchmarks.long_row",
    "elastic-cores": "benchmarks.elastic_cores",
    "demo-seeds": "benchmarks.demo_seeds",
    "shared-prompt": "benchmarks.shared_prompt",
    "sandbox-overhead": "benchmarks.sandbox_overhead",
    "packing": "benchmarks.packing",
}
"""Study name → module; each module exposes `run(size: str, out_dir: Path) -> dict`."""

SIZES = ("toy", "full")
"""`toy`: seconds, for the smoke test; `full`: the numbers published in docs/benchmarks.md."""
