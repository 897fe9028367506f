"""A plotext plot over categorical x ticks that thins its labels to the width it is drawn at."""

from __future__ import annotations

from textual.app import RenderResult
from textual_plotext import PlotextPlot

from asyncrl_cli.tui.widgets.ticks import thin_ticks


class TickedPlot(PlotextPlot):
    """A `PlotextPlot` whose `redraw` stores `_ticks = (positions, labels)`; `render` sets the ticks that fit."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._ticks: tuple[list[float], list[str]] = ([], [])

    def render(self) -> RenderResult:
        """Set tick labels that fit the current width, then let plotext draw."""
        positions, labels = self._ticks
        if positions:
            self.plt.xticks(*thin_ticks(positions, labels, max(1, self.size.width - 8)))
        return super().render()
