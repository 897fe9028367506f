"""Weight-sync time per sync: rollout pause vs transfer, stacked bars (textual-plotext)."""

from __future__ import annotations

from asyncrl_cli.tui.format import is_number
from asyncrl_cli.tui.model import SYNC_PAUSE, SYNC_TRANSFER, DashboardModel
from asyncrl_cli.tui.widgets.ticked_plot import TickedPlot


class SyncChart(TickedPlot):
    """One stacked bar per synced step (the latest `max_bars`): pause (s) below, transfer (s) on top."""

    DEFAULT_CSS = """
    SyncChart {
        border: round $primary-darken-2;
        min-height: 8;
    }
    """

    def __init__(self, *, max_bars: int = 12, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "sync time (s): pause vs transfer"
        self.max_bars = max_bars
        self.bars = 0

    def redraw(self, model: DashboardModel) -> None:
        steps: list[str] = []
        pause: list[float] = []
        transfer: list[float] = []
        for record in model.metrics:
            p, t = record.get(SYNC_PAUSE), record.get(SYNC_TRANSFER)
            if is_number(p) and is_number(t):
                steps.append(str(record.get("training/global_step", len(steps))))
                pause.append(float(p))
                transfer.append(float(t))
        steps, pause, transfer = steps[-self.max_bars :], pause[-self.max_bars :], transfer[-self.max_bars :]
        plt = self.plt
        plt.clear_data()
        self._ticks = ([], [])
        self.bars = len(steps)
        if steps:
            # numeric positions with explicit tick labels: plotext orders string categories by hash
            positions = [float(i) for i in range(1, len(steps) + 1)]
            plt.stacked_bar(
                positions,
                [pause, transfer],
                labels=["pause", "transfer"],
                color=["orange", "cyan"],
                width=0.6,
            )
            self._ticks = (positions, steps)
            plt.title("")
        else:
            plt.title("no sync yet")
        self.refresh()
