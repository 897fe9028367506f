"""A histogram of the latest steps (`{"edges", "counts"}` records summed over a window)."""

from __future__ import annotations

from asyncrl_cli.tui.model import DashboardModel
from asyncrl_cli.tui.widgets.ticked_plot import TickedPlot


def bin_labels(edges: list[float]) -> list[str]:
    """Bin centres as short labels (`1.12`, `2`)."""
    return [f"{(lo + hi) / 2:.3g}" for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


class HistogramChart(TickedPlot):
    """Bars of `key`'s histogram summed over the latest `window` records."""

    DEFAULT_CSS = """
    HistogramChart {
        border: round $primary-darken-2;
        min-height: 8;
    }
    """

    def __init__(self, key: str, title: str, *, xlabel: str, window: int = 5, id: str | None = None) -> None:
        super().__init__(id=id)
        self.key = key
        self.window = window
        self.border_title = f"{title} (last {window} steps)"
        self.xlabel = xlabel
        self.total = 0.0

    def on_mount(self) -> None:
        super().on_mount()
        self.plt.xlabel(self.xlabel)

    def redraw(self, model: DashboardModel) -> None:
        hist = model.histogram(self.key, self.window)
        plt = self.plt
        plt.clear_data()
        self._ticks = ([], [])
        if hist is None:
            self.total = 0.0
            plt.title("no histogram recorded")
        else:
            edges, counts = hist
            self.total = sum(counts)
            # numeric positions with explicit tick labels: plotext orders string categories by hash
            positions = [float(i) for i in range(1, len(counts) + 1)]
            plt.bar(positions, counts, color="cyan", width=0.8)
            self._ticks = (positions, bin_labels(edges))
            plt.title("")
        self.refresh()
