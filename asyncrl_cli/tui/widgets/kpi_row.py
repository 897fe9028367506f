"""The KPI row: throughputs, step time (against the plan), queue, staleness vs bound, IS clip/mask, ESS, sync
interval (pending marker)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from asyncrl_cli.tui import model as m
from asyncrl_cli.tui.format import MISSING, fmt_num, fmt_pct, fmt_rate, is_number


class Kpi(Static):
    """One labelled value (the label is the border title); classes `-warn` / `-alert` colour it.

    Labels: train/gen tok/s = trainer and rollout throughput; staleness = `mean / max ≤ bound` in policy
    versions; IS clip/mask = share of IS weights above the threshold / tokens masked by rejection sampling.
    """

    DEFAULT_CSS = """
    Kpi {
        width: 1fr;
        height: 3;
        border: round $primary;
        border-title-color: $text-muted;
        content-align: center middle;
        text-style: bold;
    }
    Kpi.-warn { border: round $warning; color: $warning; }
    Kpi.-alert { border: round $error; color: $error; }
    """

    def __init__(self, label: str, *, id: str) -> None:
        super().__init__(MISSING, id=id)
        self.border_title = label

    def set(self, text: str, level: str = "") -> None:
        """Show `text` (no layout pass: the box has a fixed size; nothing is redrawn when unchanged)."""
        if str(self.content) != text:
            self.update(text, layout=False)
        self.set_class(level == "warn", "-warn")
        self.set_class(level == "alert", "-alert")


def staleness_kpi(model: m.DashboardModel) -> tuple[str, str]:
    """`mean / max ≤ bound` in policy versions; alert when max exceeds the bound."""
    mean, worst, bound = model.latest(m.STALE_MEAN), model.latest(m.STALE_MAX), model.latest(m.STALE_BOUND)
    text = f"{fmt_num(mean, 2)} / {fmt_num(worst)} ≤ {fmt_num(bound)}"
    if is_number(worst) and is_number(bound):
        if worst > bound:
            return text, "alert"
        if worst == bound:
            return text, "warn"
    return text, ""


DRIFT_WARN = 0.25
"""|measured ÷ planned − 1| above this colours the step-time box (warn; twice it: alert)."""


def step_time_kpi(model: m.DashboardModel) -> tuple[str, str]:
    """Measured step time in s; with a plan (`launch --plan`) `measured / planned drift`, e.g. `0.41 / 0.38 +8%`."""
    measured, planned = model.step_time(), model.planned_step_time()
    if measured is None:
        return (f"{MISSING} / {fmt_num(planned, 2)}" if planned else MISSING), ""
    if planned is None:
        return f"{fmt_num(measured, 3)} s", ""
    drift = measured / planned - 1
    level = "alert" if abs(drift) > 2 * DRIFT_WARN else "warn" if abs(drift) > DRIFT_WARN else ""
    return f"{fmt_num(measured, 2)} / {fmt_num(planned, 2)} {drift:+.0%}", level


def sync_kpi(model: m.DashboardModel) -> tuple[str, str]:
    """Applied sync interval in local steps, with `→ new (pending)` until the trainer acknowledges."""
    applied, pending, requested = model.sync_interval()
    if pending:
        return f"{fmt_num(applied)} → {fmt_num(requested)} pending", "warn"
    return f"{fmt_num(applied)} steps", ""


class KpiRow(Horizontal):
    """The row of KPI boxes under the header."""

    DEFAULT_CSS = """
    KpiRow {
        height: 3;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.boxes = {
            key: Kpi(label, id=f"kpi-{key}")
            for key, label in (
                ("trainer", "train tok/s"),
                ("rollout", "gen tok/s"),
                ("step", "step s / plan"),
                ("queue", "queue"),
                ("staleness", "staleness"),
                ("is", "clip/mask"),
                ("ess", "IS ESS"),
                ("sync", "sync every"),
            )
        }

    def compose(self) -> ComposeResult:
        yield from self.boxes.values()

    def show(self, model: m.DashboardModel) -> None:
        box = self.boxes
        box["trainer"].set(fmt_rate(model.latest(m.TRAINER_TPS)))
        box["rollout"].set(fmt_rate(model.latest(m.ROLLOUT_TPS)))
        box["step"].set(*step_time_kpi(model))
        box["queue"].set(fmt_num(model.latest(m.QUEUE)))
        box["staleness"].set(*staleness_kpi(model))
        box["is"].set(f"{fmt_pct(model.latest(m.IS_CLIP))} / {fmt_pct(model.latest(m.RS_MASK))}")
        box["ess"].set(fmt_num(model.latest(m.ESS), 3))
        box["sync"].set(*sync_kpi(model))
