"""Input modal for a knob value, validated against the knob's type and range as the user types."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.validation import ValidationResult, Validator
from textual.widgets import Input, Label, Static

from asyncrl_cli.tui.format import fmt_value
from engine.control.knobs import KNOB_SPECS, KnobError, parse_knob_value


class KnobValidator(Validator):
    """Accepts exactly what the controller would accept for this knob (same `parse_knob_value`)."""

    def __init__(self, knob: str) -> None:
        super().__init__()
        self.knob = knob

    def validate(self, value: str) -> ValidationResult:
        try:
            parse_knob_value(self.knob, value)
        except KnobError as err:
            return self.failure(str(err))
        return self.success()


class KnobInputScreen(ModalScreen[Any]):
    """Dismisses with the parsed value on a valid Enter, or None on `escape`."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="knob-cancel")]
    DEFAULT_CSS = """
    KnobInputScreen { align: center middle; }
    KnobInputScreen > Vertical {
        width: 72; height: auto; padding: 1 2;
        border: thick $primary; background: $surface;
    }
    KnobInputScreen #knob-title { text-style: bold; }
    KnobInputScreen #knob-error { color: $error; height: auto; min-height: 1; }
    KnobInputScreen #knob-help { color: $text-muted; }
    """

    def __init__(self, knob: str, current: Any, title: str) -> None:
        super().__init__()
        self.knob = knob
        self.current = current
        self.title_text = title

    def compose(self) -> ComposeResult:
        spec = KNOB_SPECS[self.knob]
        with Vertical():
            yield Label(self.title_text, id="knob-title")
            yield Static(
                f"{spec.description}. Current: {fmt_value(self.current)}. "
                f"Accepted: {spec.range_text()}; applies {spec.applies}.",
                id="knob-help",
            )
            yield Input(
                placeholder=fmt_value(self.current),
                id="knob-value",
                validators=[KnobValidator(self.knob)],
                validate_on=["changed", "submitted"],
            )
            yield Static("", id="knob-error")
            yield Static("Enter: continue to confirmation · Esc: cancel", id="knob-keys")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._show(event.validation_result, event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self._show(event.validation_result, event.value):
            return
        self.dismiss(parse_knob_value(self.knob, event.value))

    def _show(self, result: ValidationResult | None, value: str) -> bool:
        """Display the first failure (or nothing); True when the value is acceptable."""
        error = self.query_one("#knob-error", Static)
        if not value.strip():
            error.update("enter a value")
            return False
        if result is not None and not result.is_valid:
            error.update(result.failure_descriptions[0])
            return False
        error.update("")
        return True

    def action_cancel(self) -> None:
        self.dismiss(None)
