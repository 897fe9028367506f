"""The `?` help screen: keys, what each knob does (both from the knob table), and what read-only means."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from engine.control.knob_table import KNOBS

def keys_mutating() -> str:
    """The mutating keys: one row per knob of the table with a key, then checkpoint."""
    rows = ["| key | action |", "|---|---|"]
    for k in KNOBS.values():
        if not k.key:
            continue
        if k.kind is bool:
            rows.append(f"| `{k.key}` | {k.verb(True).lower()} / {k.verb(False).lower()} (`{k.name}`, confirmed) |")
        else:
            rows.append(f"| `{k.key}` | change the {k.label().lower()} (`{k.name}`) — validated, then confirmed |")
    rows.append("| `c` | checkpoint now (confirmed) |")
    return "\n".join(rows) + "\n"


KEYS_COMMON = """\
| key | action |
|---|---|
| `1`–`5` | overview · distributions · workers · events · config |
| `ctrl+p` | command palette |
| `ctrl+r` | poll now |
| `?` | this help |
| `q` | detach — the run goes on |
"""


def help_markdown(read_only: bool) -> str:
    """The help text; the mutating keys are listed only when changes are allowed."""
    knobs = "\n".join(
        f"- **{s.name}** ({s.range_text()}): {s.description}; applies {s.applies}."
        for s in KNOBS.values()
    )
    parts = ["# asyncrl dashboard", KEYS_COMMON]
    if read_only:
        parts.append("**Read-only:** this session cannot change the run (no knob, pause or checkpoint keys).")
    else:
        parts += [
            keys_mutating(),
            "## Knobs",
            knobs,
            "Every change is compare-and-set: if someone else changed the knob after you opened the "
            "input, it is rejected and you retry with the new value. Changes show as *pending* until "
            "the trainer or rollouter acknowledges them; the events log records old → new, who, "
            "when and the step at which it took effect. `stop` is only in the command palette.",
        ]
    return "\n\n".join(parts)


class HelpScreen(ModalScreen[None]):
    """Closes with `escape`, `q` or `?`."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help-close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; height: 80%; padding: 0 2;
        border: thick $primary; background: $surface;
    }
    """

    def __init__(self, read_only: bool) -> None:
        super().__init__()
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(help_markdown(self.read_only))

    def action_close(self) -> None:
        self.dismiss(None)
