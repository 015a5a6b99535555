"""An alert in full: its evidence, what it signals and does not prove, what to try next."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from probes.kernel.diagnosis import Alert
from tui.format import number
from tui.run import AlertEntry
from tui.screens.panel import PanelScreen
from tui.widgets.alerts_panel import SEVERITY_STYLE


class AlertDetail(PanelScreen):
    """Modal view of one alert; Escape or q closes it."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, entry: AlertEntry) -> None:
        super().__init__()
        self.entry = entry

    def compose(self) -> ComposeResult:
        alert = self.entry.alert
        with VerticalScroll():
            yield Static(self._title(), id="title")
            yield Static(evidence_table(alert), id="evidence")
            yield Static(Text.assemble(("What it signals. ", "bold"), alert.signal), id="signal")
            if len(alert.layers) > 1 or alert.folded:
                yield Static(incident_text(alert), id="incident")
            yield Static(experiments_text(alert), id="experiments")
            yield Static(Text("Escape closes.", style="dim"))

    def _title(self) -> Text:
        alert = self.entry.alert
        text = Text(alert.kind, style=f"bold {SEVERITY_STYLE.get(alert.severity, '')}")
        text.append(f"  {alert.severity}  step {alert.step:,}")
        if alert.subject:
            text.append(f"  on {alert.subject}")
        if self.entry.from_probe:
            text.append("  (raised in the training process)", style="dim")
        if not self.entry.active:
            text.append("  cleared", style="dim")
        return text


def evidence_table(alert: Alert) -> Table:
    """The numbers that triggered the alert."""
    table = Table(
        title="Evidence", title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0)
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in alert.evidence.items():
        shown = number(value) if isinstance(value, float) else str(value)
        table.add_row(key.replace("_", " "), shown)
    return table


def incident_text(alert: Alert) -> Text:
    """The layers the alert concerns (the first failing one first) and the
    consequences folded under it."""
    text = Text()
    if len(alert.layers) > 1:
        text.append("Layers ", style="bold")
        text.append(
            f"({len(alert.layers)}, the first failing first): "
            + ", ".join(alert.layers[:12])
            + (" ..." if len(alert.layers) > 12 else "")
            + "\n"
        )
    if alert.folded:
        text.append("Folded under it ", style="bold")
        text.append(
            "(consequences, not raised on their own): "
            + ", ".join(f.replace("@", " at step ") for f in alert.folded)
            + "\n"
        )
    return text


def experiments_text(alert: Alert) -> Text:
    """The next controlled experiments, numbered."""
    text = Text("Next experiments (one change each)\n", style="bold")
    for i, experiment in enumerate(alert.experiments, start=1):
        text.append(f"  {i}. {experiment}\n", style="")
    return text
