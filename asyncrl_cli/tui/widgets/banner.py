"""The disconnect banner: visible while the source raises, hidden again once a poll succeeds."""

from __future__ import annotations

from textual.widgets import Static

from asyncrl_cli.tui.format import fmt_clock


class DisconnectBanner(Static):
    """Red bar under the header saying what failed and that polling keeps retrying."""

    DEFAULT_CSS = """
    DisconnectBanner {
        display: none;
        height: auto;
        padding: 0 1;
        background: $error;
        color: $text;
        text-style: bold;
    }
    DisconnectBanner.-shown {
        display: block;
    }
    """

    def show_error(self, error: str, last_data_at: float | None, interval_s: float) -> None:
        since = f"; last data at {fmt_clock(last_data_at)}" if last_data_at else ""
        self.update(
            f"DISCONNECTED: {error} — retrying every {interval_s:g} s{since}. "
            f"The run itself is not affected by this dashboard."
        )
        self.add_class("-shown")

    def clear(self) -> None:
        self.remove_class("-shown")

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")
