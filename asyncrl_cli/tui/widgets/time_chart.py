"""A line chart of metrics over local steps (textual-plotext)."""

from __future__ import annotations

from dataclasses import dataclass

from textual_plotext import PlotextPlot

from asyncrl_cli.tui.model import DashboardModel


@dataclass(frozen=True)
class Line:
    """One plotted metric: record key, legend label, plotext colour."""

    key: str
    label: str
    color: str


def step_ticks(first: float, last: float, count: int = 5) -> list[float]:
    """Up to `count` evenly spread whole steps from `first` to `last` (steps are integers)."""
    if last <= first:
        return [float(round(first))]
    return sorted({float(round(first + (last - first) * i / (count - 1))) for i in range(count)})


class TimeChart(PlotextPlot):
    """Plots each `Line` of the model's history against `training/global_step`.

    A `Line` whose series is empty is skipped; with no data at all the chart says so.
    """

    DEFAULT_CSS = """
    TimeChart {
        border: round $primary-darken-2;
        min-height: 8;
    }
    """

    def __init__(self, title: str, lines: list[Line], *, ylabel: str = "", id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title
        self.lines = lines
        self.ylabel = ylabel
        self.plotted: dict[str, int] = {}

    def on_mount(self) -> None:
        super().on_mount()
        self.plt.xlabel("step")
        if self.ylabel:
            self.plt.ylabel(self.ylabel)

    def redraw(self, model: DashboardModel) -> None:
        """Replot from the model; `plotted` records how many points each line got (for tests)."""
        plt = self.plt
        plt.clear_data()
        self.plotted = {}
        steps: list[float] = []
        for line in self.lines:
            xs, ys = model.series(line.key)
            if xs:
                plt.plot(xs, ys, label=line.label, color=line.color, marker="braille")
                self.plotted[line.key] = len(xs)
                steps += [xs[0], xs[-1]]
        if steps:
            ticks = step_ticks(min(steps), max(steps))
            plt.xticks(ticks, [str(int(t)) for t in ticks])
        if not self.plotted:
            plt.title("waiting for data")
        else:
            plt.title("")
        self.refresh()
