"""The alerts panel: one line per alert, severity coloured; Enter opens the detail."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from probes.kernel.diagnosis import Severity
from probes.kernel.diagnosis.book import checklist_order
from tui.run import AlertEntry, RunState
from tui.text import cut, plain_name, shorten_middle

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
        self._widths: Widths | None = None

    def on_resize(self) -> None:
        """Refit the columns to the new width (the run list may have taken some): the
        alerts shown, not newer ones (the views change together, at the app's tick)."""
        self._draw(self.entries)

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's alerts (active first, in checklist order), each
        column fitted to the panel's width (``fit_columns``)."""
        self._draw(sorted_alerts(run.alerts) if run is not None else [])

    def _draw(self, entries: list[AlertEntry]) -> None:
        rows = [_cells(entry) for entry in entries]
        widths = fit_columns(self.outer_size.width, rows)  # (scroll bars counted: steady)
        shown = [(id(e), e.active, e.alert.folded, e.alert.layers) for e in entries]
        if shown == self._shown and widths == self._widths:
            return
        self._shown = shown
        self.entries = entries
        cursor = self.cursor_row
        self.clear(columns=widths != self._widths)
        if not self.columns:
            self._widths = widths
            self.add_column("", key="sev", width=1)
            for key, label, width in zip(
                ("step", "kind", "subject", "state"),
                ("step", "alert", "on", ""),
                widths,
                strict=True,
            ):
                self.add_column(label, key=key, width=width)
        if not entries:
            self.add_row("", "", Text("no alerts", style="dim"), "", "")
        for entry, (step, kind, subject, _) in zip(entries, rows, strict=True):
            alert = entry.alert
            style = SEVERITY_STYLE.get(alert.severity, "") if entry.active else "dim"
            self.add_row(
                Text(SEVERITY_MARK.get(alert.severity, "?"), style=style),
                step,
                Text(shorten_middle(kind, widths[1]), style=style),
                Text(_subject(subject, widths[2])),
                Text(state_text(entry, widths[3])),
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


Widths = tuple[int, int, int, int]  # step, kind, subject, state
KIND_WIDTH = 24  # an alert kind's column at most (the longest kind is shortened)
KIND_MIN = 14
SUBJECT_WIDTH = 26
SUBJECT_MIN = 10
STATE_MIN = 9  # "+1 folded" whole
CELL_PADDING = 2  # a DataTable cell's padding, both sides
SCROLL_BAR = 2  # more alerts than rows


def fit_columns(width: int, rows: list[tuple[str, str, str, str]]) -> Widths:
    """The widths of the step, kind, subject and state columns in a panel ``width``
    wide, from the rows' full texts: the step whole; the kind, then the subject,
    shortened from the middle down to their minimums so that the state column (how
    many folded) stays on screen; an unlaid panel (``width`` 0) gets them whole."""
    step = max((len(r[0]) for r in rows), default=4)
    kind = min(max((len(r[1]) for r in rows), default=KIND_MIN), KIND_WIDTH)
    subject = min(max((len(r[2]) for r in rows), default=SUBJECT_MIN), SUBJECT_WIDTH)
    state = max((len(r[3]) for r in rows), default=0)
    step, kind, subject = max(step, 4), max(kind, KIND_MIN), max(subject, 2)
    if width <= 0:
        return step, kind, subject, max(state, 1)
    room = width - SCROLL_BAR - CELL_PADDING * 5 - 1 - step  # kind, subject, state
    wanted_state = min(state, STATE_MIN) if state else 0
    subject = min(subject, max(room - kind - wanted_state, SUBJECT_MIN))
    kind = min(kind, max(room - subject - wanted_state, KIND_MIN))
    return step, kind, subject, max(room - kind - subject, 1)


def _cells(entry: AlertEntry) -> tuple[str, str, str, str]:
    """An alert's step, kind, subject (``l0 +2``: the layers it stands for) and state,
    in full."""
    alert = entry.alert
    others = len(alert.layers) - 1 if alert.subject in alert.layers else 0
    subject = plain_name(alert.subject or "run") + (f" +{others}" if others > 0 else "")
    return f"{alert.step:,}", plain_name(alert.kind), subject, state_text(entry)


def _subject(subject: str, width: int) -> str:
    """The subject shortened from the middle, its ``+N`` (more layers) kept."""
    name, plus, more = subject.rpartition(" +")
    if plus and more.isdigit():
        return shorten_middle(name, max(width - len(plus) - len(more), 1)) + plus + more
    return shorten_middle(subject, width)


def state_text(entry: AlertEntry, width: int = 0) -> str:
    """Cleared or not, and the consequences folded under it, in ``width`` characters
    (0: no bound): ``+1 folded: update_ratio; cleared at 1,200``; what gives way, in
    order: the step it was cleared at, the names of what folded, ``cleared``; then the
    rest is cut."""
    alert = entry.alert
    folded = f"+{len(alert.folded)} folded" if alert.folded else ""
    names = ", ".join(plain_name(f.split("@")[0]) for f in alert.folded)
    cleared = ""
    if not entry.active:
        cleared = "cleared" if entry.cleared_at is None else f"cleared at {entry.cleared_at:,}"
    choices = [
        (f"{folded}: {names}" if folded else "", cleared),
        (f"{folded}: {names}" if folded else "", "cleared" if cleared else ""),
        (folded, "cleared" if cleared else ""),
        (folded, ""),
    ]
    for parts in choices:
        text = "; ".join(part for part in parts if part)
        if width <= 0 or len(text) <= width:
            return text
    return cut(folded or "cleared", width)
