"""The long-row study end to end at toy size (a 512-wide, 2-layer slice; real HF forward/backward in fresh
subprocesses, as at full size): it writes its JSON and PNG, recompute and the token budget lower the measured
peaks, and the 28k-token point is reported as not measured, with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cli import run_study
from benchmarks.long_row import TOY, check_target_length, step_cases


def test_the_budget_step_uses_the_trainers_token_budget_grouping() -> None:
    cases = {(c["tokens"], c["name"]): c for c in step_cases(1024, 2048, 3)}
    assert set(cases) == {(1024, "plain"), (1024, "recompute"), (2048, "plain"), (2048, "recompute"),
                          (1024, "padded"), (1024, "recompute + budget")}
    assert cases[(1024, "padded")]["micro_batches"] == [[1024, 256, 256, 256]]
    # budget = the long row: the long row alone, then the short rows together (heaviest first)
    assert cases[(1024, "recompute + budget")]["micro_batches"] == [[1024], [256, 256, 256]]
    assert cases[(1024, "recompute + budget")]["recompute"] and not cases[(1024, "padded")]["recompute"]
    assert cases[(2048, "recompute")]["recompute"] and not cases[(2048, "plain")]["recompute"]


@pytest.mark.integration
def test_long_row_toy(tmp_path: Path) -> None:
    run_study("long-row", "toy", tmp_path)
    data = json.loads((tmp_path / "long-row.json").read_text())
    assert (tmp_path / "long-row.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["study"] == "long-row" and data["size"] == "toy" and "quiet_wait" in data
    cases = {(c["tokens"], c["name"]): c for c in data["measurements"]["cases"]}
    assert set(cases) == {(128, "plain"), (128, "recompute"), (128, "padded"), (128, "recompute + budget"),
                          (256, "plain"), (256, "recompute")}
    assert all(len(c["seconds"]) == 2 and min(c["seconds"]) > 0 for c in cases.values())
    med = {k: sorted(c["peaks"])[len(c["peaks"]) // 2] for k, c in cases.items()}
    for t in (128, 256):
        assert med[(t, "recompute")] < med[(t, "plain")]
    assert med[(128, "recompute + budget")] < med[(128, "padded")]
    fits = data["derived"]["fits"]
    assert fits["plain"]["slope"] > fits["recompute"]["slope"] > 0  # activations grow with T, slower with recompute
    titles = [t["title"] for t in data["tables"]]
    assert any(t.startswith("EXTRAPOLATION (not measured)") for t in titles)
    targets = {t["target"]: t for t in data["targets"]}
    measured_28k = next(t for name, t in targets.items() if name.endswith("28672-token row measured"))
    assert measured_28k["status"] == "not measured" and "GB here" in measured_28k["why"]
    assert all(t["status"] in ("met", "missed") for t in targets.values() if t is not measured_28k)


@pytest.mark.integration
def test_the_target_length_check_writes_both_modes(tmp_path: Path) -> None:
    path = check_target_length(tmp_path, layers=1, tokens=512, threads=1, shape=TOY)
    assert path.name == "long-row-28k-1l.json"
    data = json.loads(path.read_text())
    plain, recompute = data["measurements"]["cases"]
    assert (plain["name"], recompute["name"]) == ("plain", "recompute")
    assert plain["micro_batches"] == recompute["micro_batches"] == [[512]]
    assert plain["peaks"][0] > 0 and recompute["peaks"][0] > 0 and data["derived"]["activation_cut"] > 0
