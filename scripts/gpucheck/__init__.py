"""Building blocks of `scripts/gpu_check.py` (random models at real sizes, the benchmarks, the report)."""
