"""The per-side copy-rate script runs both copy + fingerprint paths (at a toy size; rates are not asserted)."""

from __future__ import annotations

import os

import benchmarks.weight_sync_copy_rates as rates
import engine.sync.native as native


def test_copy_rates_prints_numpy_and_native_rows(monkeypatch, capsys) -> None:
    monkeypatch.setattr(rates, "N", 4 * 2**20)
    monkeypatch.delenv("ASYNCRL_NATIVE", raising=False)
    rates.main()
    out = capsys.readouterr().out
    assert "numpy: copy + fused fingerprint, 256 KiB chunks" in out
    assert "GB/s  numpy copyto (1 thread, one call)" in out
    if native.kernel() is not None:
        assert "native: copy + fingerprint, one pass, non-temporal stores" in out
        assert native.NT_MIN == 256 * 1024  # restored
    else:
        assert "no native kernel" in out
    assert "ASYNCRL_NATIVE" not in os.environ  # the numpy rows' switch is restored
