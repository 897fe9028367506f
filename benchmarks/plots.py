"""Matplotlib on the headless Agg backend, and the few chart shapes the studies share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """`matplotlib.pyplot` with the Agg backend selected (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out_dir: Path, study: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{study}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def bars(
    ax: Any,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    ylabel: str,
    title: str,
    fmt: str = "{:.2f}",
    colors: Sequence[str] | None = None,
    hline: float | None = None,
    hline_label: str = "",
) -> None:
    """A labelled bar chart (value printed on each bar), with an optional horizontal target line."""
    xs = range(len(labels))
    drawn = ax.bar(xs, values, color=colors)
    for rect, v in zip(drawn, values):
        ax.annotate(
            fmt.format(v),
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1, label=hline_label)
        if hline_label:
            ax.legend(fontsize=8)
