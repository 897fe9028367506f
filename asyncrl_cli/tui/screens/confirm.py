"""A yes/no confirmation modal showing what will change (old → new) and any warnings."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True on `y`/Confirm, False on `n`/`escape`/Cancel."""

    BINDINGS = [
        Binding("y", "confirm", "Confirm", id="confirm-yes"),
        Binding("n,escape", "cancel", "Cancel", id="confirm-no"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 72; height: auto; padding: 1 2;
        border: thick $warning; background: $surface;
    }
    ConfirmScreen #confirm-title { text-style: bold; margin-bottom: 1; }
    ConfirmScreen #confirm-warnings { color: $warning; margin-top: 1; }
    ConfirmScreen Horizontal { height: auto; margin-top: 1; align: right middle; }
    ConfirmScreen Button { margin-left: 2; }
    """

    def __init__(self, title: str, body: str, warnings: list[str] | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.warnings = warnings or []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="confirm-title")
            yield Static(self.body, id="confirm-body")
            if self.warnings:
                yield Static("\n".join(f"! {w}" for w in self.warnings), id="confirm-warnings")
            with Horizontal():
                yield Button("Cancel (n)", id="cancel")
                yield Button("Confirm (y)", id="confirm", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#confirm", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
