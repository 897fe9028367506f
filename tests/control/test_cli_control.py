"""`asyncrl attach | ctl | status` through the real Typer app: replay output, usage errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_tiny"
cli = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_status_of_a_recorded_run() -> None:
    code, out = invoke("status", "--replay", str(FIXTURE), "--json")
    assert code == 0, out
    doc = json.loads(out)
    last = json.loads((FIXTURE / "metrics.jsonl").read_text().splitlines()[-1])
    assert doc["step"] == last["training/global_step"]
    assert doc["kpis"]["asyncrl/trainer/tokens_per_s"] == last["asyncrl/trainer/tokens_per_s"]
    assert set(doc["knobs"]) == {"trigger_parameter_sync_step", "staleness_threshold", "paused"}
    assert any(w["role"] == "trainer" for w in doc["workers"])
    code, human = invoke("status", "--replay", str(FIXTURE))
    assert code == 0 and "knobs" in human and "workers" in human and "recent events" in human


def test_attach_json_once_prints_the_whole_snapshot() -> None:
    code, out = invoke("attach", "--replay", str(FIXTURE), "--json", "--once")
    assert code == 0, out
    snap = json.loads(out)
    n_metrics = len((FIXTURE / "metrics.jsonl").read_text().splitlines())
    assert len(snap["metrics"]) == n_metrics and snap["cursor"] >= n_metrics


def test_attach_json_stream_ends_with_a_finished_run() -> None:
    code, out = invoke("attach", "--replay", str(FIXTURE), "--json", "--interval", "0.1")
    assert code == 0
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert lines and lines[-1]["state"] in ("finished", "failed", "stopped")


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (("attach", "--once"), 2, "use it with --json"),
        (("attach", "tiny", "--replay", str(FIXTURE), "--json"), 2, "do not also pass RUN"),
        (("attach", "--replay", str(FIXTURE)), 2, "interactive terminal"),
        (("attach", "--replay", "/no/such/dir", "--json", "--once"), 4, "does not exist"),
        (("status", "x", "--replay", str(FIXTURE)), 2, "do not also pass RUN"),
        (("ctl", "tiny", "set", "trigger_parameter_sync_step", "0"), 1, "out of range"),
        (("ctl", "tiny", "set", "trigger_parameter_sync_step", "two"), 1, "must be an integer"),
        (("ctl", "tiny", "set", "staleness_threshold", "-1"), 1, "out of range"),
        (("ctl", "tiny", "set", "learning_rate", "1"), 1, "unknown knob"),
        (("ctl", "tiny", "stop"), 2, "--yes"),
        (("ctl", "tiny"), 2, "Missing command"),
    ],
)
def test_user_errors_are_one_line_with_the_documented_code(
    args: tuple[str, ...], code: int, fragment: str
) -> None:
    got, out = invoke(*args)
    assert got == code, out
    assert fragment in out


def test_an_unreachable_cluster_is_exit_4_and_fast() -> None:
    import ray

    if ray.is_initialized():
        pytest.skip("this process already holds a Ray connection")
    code, out = invoke("ctl", "tiny", "pause", "--address", "127.0.0.1:1")
    assert code == 4 and "no Ray cluster reachable" in out
