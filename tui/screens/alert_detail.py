"""An alert in full: its evidence, what it signals and does not prove, what to try next,
and where the manual (``docs/alerts.md``) explains its kind.

An alert raised in the training process carries the probe's own words (its kind,
subject, evidence, signal, experiments): every one is shown as plain text. What a kind
does not prove is the catalog's (``Entry.not_proved``), shown after the alert's signal.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from probes.kernel.diagnosis import CATALOG, Alert, AlertKind
from probes.kernel.diagnosis.manual import PAGE
from tui.format import number
from tui.run import AlertEntry
from tui.screens.panel import PanelScreen
from tui.text import plain_block, plain_line, plain_name
from tui.widgets.alerts_panel import SEVERITY_STYLE

MAX_LAYERS_SHOWN = 12  # layer names listed in full; the count says how many of all


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
            yield Static(
                Text.assemble(("What it signals. ", "bold"), plain_block(signal_text(alert))),
                id="signal",
            )
            if len(alert.layers) > 1 or alert.folded:
                yield Static(incident_text(alert), id="incident")
            yield Static(experiments_text(alert), id="experiments")
            if isinstance(alert.kind, AlertKind):  # (a newer probe's kind has no section)
                yield Static(manual_text(alert.kind), id="manual")
            yield Static(Text("Escape closes.", style="dim"))

    def _title(self) -> Text:
        alert = self.entry.alert
        text = Text(plain_name(alert.kind), style=f"bold {SEVERITY_STYLE.get(alert.severity, '')}")
        text.append(f"  {plain_name(alert.severity)}  step {alert.step:,}")
        if alert.subject:
            text.append(f"  on {plain_name(alert.subject)}")
        if self.entry.from_probe:
            text.append("  (raised in the training process)", style="dim")
        if not self.entry.active:
            text.append("  cleared", style="dim")
        return text


def evidence_table(alert: Alert) -> Table:
    """The numbers that triggered the alert (its cells plain text, not markup)."""
    table = Table(
        title="Evidence", title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0)
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in alert.evidence.items():
        shown = number(value) if isinstance(value, float) else plain_line(value)
        table.add_row(Text(plain_name(key).replace("_", " ")), Text(shown))
    return table


def signal_text(alert: Alert) -> str:
    """What the alert signals (its own words), then what its kind does not prove (the
    catalog's), unless its words say that already (an older probe's alert did)."""
    described = CATALOG.get(alert.kind)  # type: ignore[call-overload]
    not_proved = described.not_proved if described is not None else ""
    if not not_proved or not_proved in alert.signal:
        return alert.signal
    return f"{alert.signal} {not_proved}".strip()


def manual_text(kind: AlertKind) -> Text:
    """Where the manual explains ``kind``: ``manual: docs/alerts.md#<kind>``."""
    return Text(f"manual: {PAGE}#{kind.value}", style="dim")


def incident_text(alert: Alert) -> Text:
    """The layers the alert concerns (the first failing one first) and the
    consequences folded under it."""
    text = Text()
    if len(alert.layers) > 1:
        shown = alert.layers[:MAX_LAYERS_SHOWN]
        count = f"{len(alert.layers)}"
        if len(shown) < len(alert.layers):
            count = f"{len(shown)} shown of {len(alert.layers)}"
        text.append("Layers ", style="bold")
        text.append(
            f"({count}, the first failing first): "
            + ", ".join(plain_name(layer) for layer in shown)
            + (" ..." if len(shown) < len(alert.layers) else "")
            + "\n"
        )
    if alert.folded:
        text.append("Folded under it ", style="bold")
        text.append(
            "(consequences, not raised on their own): "
            + ", ".join(plain_name(f).replace("@", " at step ") for f in alert.folded)
            + "\n"
        )
    return text


def experiments_text(alert: Alert) -> Text:
    """The next controlled experiments, numbered."""
    text = Text("Next experiments (one change each)\n", style="bold")
    for i, experiment in enumerate(alert.experiments, start=1):
        text.append(f"  {i}. {plain_block(experiment, 1000, 12)}\n", style="")
    return text
