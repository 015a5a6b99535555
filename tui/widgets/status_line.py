"""The one-line status bar: run, step, speed, loss, connection, drops."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.format import status_fields
from tui.state import MonitorState, RunState


class StatusLine(Static):
    """Shows the selected run's vital signs on one line."""

    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $foreground;
        padding: 0 1;
    }
    """

    text: str = ""  # the plain text shown (for tests and captures)

    def show(self, run: RunState | None, monitor: MonitorState, listening: str) -> None:
        """Redraw from state."""
        fields = status_fields(run, monitor, listening)
        text = Text(fields[0], style="bold")
        for field in fields[1:]:
            text.append(" │ ", style="dim")
            text.append(field, style=_style(field))
        self.text = text.plain
        self.update(text)


def _style(field: str) -> str:
    if (field.startswith(("disconnected", "rejected", "probe off"))
            or "error" in field):
        return "bold red"
    if field.startswith("alerts") and field != "alerts 0":
        return "yellow"
    if field.startswith("dropped") and field != "dropped 0":
        return "yellow"
    if field == "connected":
        return "green"
    if field.startswith("paused") or "anomaly" in field:
        return "bold yellow"
    return ""
