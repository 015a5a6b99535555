"""The one-line status bar: run, step, speed, loss, connection, alerts, drops."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.format import fit_status, run_ending
from tui.run import RunState
from tui.state import MonitorState

PROBE_COST_WARN = 0.05  # the probe's share of a step shown in yellow above this


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

    def show(self, run: RunState | None, monitor: MonitorState, listening: str) -> None:
        """Redraw from state, fitted to the widget's width."""
        fields, separator = fit_status(run, monitor, listening, self.size.width)
        text = Text(fields[0], style="bold")
        for field in fields[1:]:
            text.append(separator, style="dim")
            text.append(field, style=_style(field, run))
        self.text = text.plain
        self.update(text)


def _style(field: str, run: RunState | None) -> str:
    ending = run_ending(run) if run is not None and not run.probe_error else None
    if ending is not None and field.startswith(ending.ending.label):
        return ending.style  # how the run ended says how it is shown
    if field.startswith("alerts"):
        active = run.active_alerts if run is not None else []
        if any(alert.severity == "error" for alert in active):
            return "bold red"
        return "yellow" if active else ""
    if field.startswith("probe "):
        share = run.probe_share if run is not None else None
        return "yellow" if share is not None and share > PROBE_COST_WARN else ""
    if field.startswith(("disconnected", "rejected", "rej ", "probe off")) or "error" in field:
        return "bold red"
    if field.startswith(("dropped", "drop ")) and field not in ("dropped 0", "drop 0"):
        return "yellow"
    if field == "connected":
        return "green"
    if field.startswith("paused") or "anomaly" in field:
        return "bold yellow"
    return ""
