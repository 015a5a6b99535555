"""Runs side by side: pick two or more, then their losses overlaid and per-layer
gradient-norm ratios against a reference run, redrawn live."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, SelectionList, Static
from textual.widgets.selection_list import Selection

from tui.compare import LayerRatio, layer_ratios
from tui.format import alerts_label, number, run_label, validation_label
from tui.run import RunState
from tui.state import MonitorState
from tui.text import plain_name
from tui.widgets.layer_table import short_name
from tui.widgets.loss_overlay import LossOverlay, run_color

FRAME_RATE_HZ = 8
PRESELECT_UP_TO = 4  # with this many runs or fewer, the picker starts with all picked


class ComparePicker(ModalScreen[list[str] | None]):
    """Pick the runs to compare: space or Enter toggles, m compares, Escape cancels."""

    BINDINGS = [Binding("m", "compare", "Compare"), Binding("escape,q", "cancel", "Cancel")]
    DEFAULT_CSS = """
    ComparePicker {
        align: center middle;
    }
    ComparePicker > Vertical {
        width: 70;
        max-width: 95%;
        height: auto;
        max-height: 90%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    ComparePicker SelectionList {
        max-height: 16;
    }
    """

    def __init__(self, state: MonitorState, current: str | None) -> None:
        super().__init__()
        self.state = state
        self.current = current

    def compose(self) -> ComposeResult:
        runs = list(self.state.runs.values())
        every = len(runs) <= PRESELECT_UP_TO
        with Vertical():
            yield Static(
                Text.assemble(
                    ("Compare runs\n", "bold"),
                    "space or Enter picks a run; the first picked is the reference "
                    "(r changes it there). ",
                    ("m", "bold"),
                    " compares, ",
                    ("Escape", "bold"),
                    " cancels.",
                )
            )
            yield SelectionList[str](
                *(
                    Selection(Text(run_label(run)), run.run_id, every or run.run_id == self.current)
                    for run in runs
                ),
                id="picked",
            )

    def action_compare(self) -> None:
        picked = self.query_one(SelectionList).selected
        order = [run_id for run_id in self.state.runs if run_id in picked]
        if len(order) < 2:
            self.notify("pick two runs or more", severity="warning")
            return
        self.dismiss(order)

    def action_cancel(self) -> None:
        self.dismiss(None)


class CompareScreen(Screen[None]):
    """Losses overlaid and per-layer gradient-norm ratios against the reference run.

    Args:
        state: the monitor's state (read at each redraw: live runs keep moving).
        run_ids: the runs to compare, the reference first; None: every run, in the
            order they connected (``traintop replay a.ndjson b.ndjson``: a is the
            reference).
    """

    BINDINGS = [
        Binding("escape,q,m", "close", "Back"),
        Binding("r", "next_reference", "Reference"),
        # The main screen's keys act on one run: not from here (nor in the footer).
        Binding("p,n,a,g,h,v,c,l,s,minus,plus,equals_sign", "main_screen_only", show=False),
    ]
    DEFAULT_CSS = """
    CompareScreen {
        overflow-y: hidden;
    }
    CompareScreen #compare-runs {
        height: auto;
        max-height: 7;
        padding: 0 1;
        background: $panel;
    }
    CompareScreen LossOverlay {
        height: 1fr;
        min-height: 8;
    }
    CompareScreen #ratios {
        height: auto;
        max-height: 40%;
    }
    """

    def __init__(self, state: MonitorState, run_ids: list[str] | None = None) -> None:
        super().__init__()
        self.state = state
        self.run_ids = run_ids
        self._rotation = 0  # how far the reference moved (r)
        self._drawn = (-1, -1, -1)  # (state version, rotation, width) last drawn
        self.header_text = ""  # plain text of the run summary (tests, captures)
        self._table_key: tuple[object, ...] = ()  # the runs and layers the columns show

    def compose(self) -> ComposeResult:
        yield Static(id="compare-runs")
        yield LossOverlay(id="overlay")
        yield DataTable(id="ratios", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(1 / FRAME_RATE_HZ, self.redraw)
        self.redraw()

    def on_resize(self) -> None:
        self.redraw(force=True)

    def runs(self) -> list[RunState]:
        """The compared runs, the reference first."""
        ids = self.run_ids if self.run_ids is not None else list(self.state.runs)
        runs = [self.state.runs[run_id] for run_id in ids if run_id in self.state.runs]
        if not runs:
            return []
        shift = self._rotation % len(runs)
        return runs[shift:] + runs[:shift]

    def redraw(self, force: bool = False) -> None:
        """Redraw every part from state, if anything changed since the last frame."""
        key = (self.state.version, self._rotation, self.size.width)
        if key == self._drawn and not force:
            return
        self._drawn = key
        runs = self.runs()
        self._header(runs)
        self.query_one(LossOverlay).show(runs)
        self._ratios(runs)

    def _header(self, runs: list[RunState]) -> None:
        text = Text()
        if len(runs) < 2:
            text.append("waiting for two runs to compare", style="dim")
        names = [plain_name(run.name) for run in runs]
        width = max((len(name) for name in names), default=0)
        for index, run in enumerate(runs):
            if index:
                text.append("\n")
            text.append("ref " if index == 0 else "    ", style="bold")
            text.append("● ", style=run_color(index))
            text.append(names[index].ljust(width), style="bold")
            val = validation_label(run)
            text.append(
                f"  step {run.last_step:,}  loss {number(run.loss)}"
                + (f"  val {val}" if val else "")
                + f"  {alerts_label(run, short=True)}"
            )
        if len(runs) > 1:
            text.append(
                "\nratios to ref: latest grad norm, peak (largest finite); ! went non-finite",
                style="dim",
            )
        self.header_text = text.plain
        self.query_one("#compare-runs", Static).update(text)

    def _ratios(self, runs: list[RunState]) -> None:
        table = self.query_one("#ratios", DataTable)
        if len(runs) < 2:
            table.clear(columns=True)
            self._table_key = ()
            return
        reference, others = runs[0], runs[1:]
        rows = layer_ratios(reference, others)
        key = (tuple(run.run_id for run in runs), tuple(row.layer for row in rows))
        if key != self._table_key:  # new runs or layers: new columns; else cells only
            self._table_key = key
            table.clear(columns=True)
            table.add_column("layer")
            table.add_column(Text(short_name(plain_name(reference.name), 20), style=run_color(0)))
            for index, run in enumerate(others, start=1):
                table.add_column(Text(short_name(plain_name(run.name), 20), style=run_color(index)))
                table.add_column(Text("x ref", style=run_color(index)))
                table.add_column(Text("peak x ref", style=run_color(index)))
            for row in rows:
                table.add_row(*_cells(row))
            return
        for y, row in enumerate(rows):
            for x, cell in enumerate(_cells(row)):
                if str(table.get_cell_at(Coordinate(y, x))) != str(cell):
                    table.update_cell_at(Coordinate(y, x), cell)

    def action_next_reference(self) -> None:
        self._rotation += 1
        self.redraw(force=True)

    def action_close(self) -> None:
        self.dismiss()

    def action_main_screen_only(self) -> None:
        self.notify("that key acts on the main screen's run: Escape goes back to it", timeout=3)


def _cells(row: LayerRatio) -> list[Text | str]:
    cells: list[Text | str] = [Text(short_name(plain_name(row.layer), 24)), number(row.reference)]
    for latest, now, peak, bad in zip(
        row.latest, row.ratios, row.peak_ratios, row.went_non_finite, strict=True
    ):
        cells += [number(latest), _ratio_text(now), _ratio_text(peak, " !" if bad else "")]
    return cells


def _ratio_text(value: float | None, suffix: str = "") -> Text:
    """A ratio as ``12.5x``; far from 1 in colour (10x either way), non-finite in red."""
    if value is None:
        return Text("-" + suffix, style="bold red" if suffix else "dim")
    shown = number(value, 3) + ("x" if value == value and abs(value) != float("inf") else "")
    style = ""
    if value != value or value == float("inf"):
        style = "bold red"
    elif value >= 10 or value <= 0.1:
        style = "yellow"
    return Text(shown + suffix, style="bold red" if suffix else style)
