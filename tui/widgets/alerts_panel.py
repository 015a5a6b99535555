"""The alerts panel: one line per alert, severity coloured; Enter opens the detail."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from probes.kernel.diagnosis import Severity
from probes.kernel.diagnosis.book import checklist_order
from tui.run import AlertEntry, RunState
from tui.text import plain_line, plain_name

SEVERITY_STYLE = {severity: severity.style for severity in Severity}
SEVERITY_MARK = {severity: severity.mark for severity in Severity}


class AlertsPanel(DataTable[Text | str]):
    """The selected run's alerts, one per root cause: the active ones first, in the
    order of the lesson's checklist (data, shapes and loss contract, tiny batch, gradient
    path, update, evaluation), the most severe first within a rung, then by step; Enter
    opens the first. An alert standing for several layers shows how many more; one with
    consequences folded under it shows how many."""

    DEFAULT_CSS = """
    AlertsPanel {
        height: auto;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", **kwargs)  # type: ignore[arg-type]
        self.entries: list[AlertEntry] = []
        self._shown: list[tuple[int, bool, tuple[str, ...], tuple[str, ...]]] = []

    def on_mount(self) -> None:
        self.add_column("", key="sev", width=1)
        self.add_column("step", key="step", width=8)
        self.add_column("alert", key="kind", width=24)
        self.add_column("on", key="subject", width=26)
        self.add_column("", key="state")

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's alerts (active first, in checklist order)."""
        entries = sorted_alerts(run.alerts) if run is not None else []
        shown = [(id(e), e.active, e.alert.folded, e.alert.layers) for e in entries]
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
            others = len(alert.layers) - 1 if alert.subject in alert.layers else 0
            self.add_row(
                Text(SEVERITY_MARK.get(alert.severity, "?"), style=style),
                f"{alert.step:,}",
                Text(plain_name(alert.kind), style=style),
                Text(plain_name(alert.subject or "run") + (f" +{others}" if others > 0 else "")),
                Text(plain_line(_state(entry))),
            )
        if entries:
            self.move_cursor(row=min(cursor, len(entries) - 1))

    def selected(self) -> AlertEntry | None:
        """The alert under the cursor."""
        if not self.entries or not 0 <= self.cursor_row < len(self.entries):
            return None
        return self.entries[self.cursor_row]


def sorted_alerts(entries: list[AlertEntry]) -> list[AlertEntry]:
    """Active before cleared; then along the checklist (its rung); within a rung errors
    before warnings before infos; then by step (the run's book says the order; entries
    folded under a job's incident are listed under it)."""
    return checklist_order(entries)


def _state(entry: AlertEntry) -> str:
    """Cleared or not, and the consequences folded under it."""
    parts = []
    if entry.alert.folded:
        parts.append(
            f"+{len(entry.alert.folded)} folded: "
            + ", ".join(f.split("@")[0] for f in entry.alert.folded)
        )
    if not entry.active:
        parts.append("cleared" if entry.cleared_at is None else f"cleared at {entry.cleared_at:,}")
    return "; ".join(parts)
