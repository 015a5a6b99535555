"""The alerts panel: one line per alert, severity coloured; Enter opens the detail."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from probes.diagnosis import SEVERITY_ORDER
from tui.state import AlertEntry, RunState

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_MARK = {"error": "E", "warning": "W", "info": "i"}


class AlertsPanel(DataTable[Text | str]):
    """The selected run's alerts, the most severe first, then by step (the first
    error is the first line: Enter opens it)."""

    DEFAULT_CSS = """
    AlertsPanel {
        height: auto;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", **kwargs)  # type: ignore[arg-type]
        self.entries: list[AlertEntry] = []
        self._shown: list[tuple[int, bool]] = []

    def on_mount(self) -> None:
        self.add_column("", key="sev", width=1)
        self.add_column("step", key="step", width=8)
        self.add_column("alert", key="kind", width=24)
        self.add_column("on", key="subject", width=26)
        self.add_column("", key="state")

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's alerts (by severity, then step)."""
        entries = sorted_alerts(run.alerts) if run is not None else []
        shown = [(id(e), e.active) for e in entries]
        if shown == self._shown:
            return
        self._shown = shown
        self.entries = entries
        cursor = self.cursor_row
        self.clear()
        if not entries:
            self.add_row("", "", Text("no alerts", style="dim"), "", "")
        for entry in entries:
            alert = entry.alert
            style = SEVERITY_STYLE.get(alert.severity, "") if entry.active else "dim"
            self.add_row(Text(SEVERITY_MARK.get(alert.severity, "?"), style=style),
                         f"{alert.step:,}", Text(alert.kind, style=style),
                         alert.subject or "run",
                         "" if entry.active else f"cleared at {entry.cleared_at:,}"
                         if entry.cleared_at is not None else "cleared")
        if entries:
            self.move_cursor(row=min(cursor, len(entries) - 1))

    def selected(self) -> AlertEntry | None:
        """The alert under the cursor."""
        if not self.entries or not 0 <= self.cursor_row < len(self.entries):
            return None
        return self.entries[self.cursor_row]


def sorted_alerts(entries: list[AlertEntry]) -> list[AlertEntry]:
    """Errors before warnings before infos; within one severity, by step (then in the
    order raised)."""
    return sorted(entries, key=lambda e: (-SEVERITY_ORDER.get(e.alert.severity, 0),
                                          e.alert.step))
