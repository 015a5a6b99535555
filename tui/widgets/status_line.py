"""The one-line status bar: run, step, speed, loss, connection, alerts, drops."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.format import fit_status
from tui.run import RunState
from tui.state import MonitorState


class StatusLine(Static):
    """Shows the selected run's vital signs on one line, abbreviated when narrow."""

    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $foreground;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    text: str = ""  # the plain text shown (for tests and captures)
    styled: tuple[str, ...] = ()  # the fields shown in a style of their own (an alert's)

    def show(self, run: RunState | None, monitor: MonitorState, listening: str) -> None:
        """Redraw from state, fitted to the widget's width."""
        fields, separator = fit_status(run, monitor, listening, self.size.width)
        text = Text(fields[0], style="bold")
        for field in fields[1:]:
            text.append(separator, style="dim")
            text.append(field, style=getattr(field, "style", ""))  # a StatusField's
        self.text = text.plain
        self.styled = tuple(str(f) for f in fields[1:] if getattr(f, "style", ""))
        self.update(text)
