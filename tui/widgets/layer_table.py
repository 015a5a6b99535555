"""Per-layer gradient table: layer, grad norm, its recent history, param norm, update
ratio, status, and the largest gradient element where the run measures it and the
table has room."""

from __future__ import annotations

import math

from rich.text import Text
from textual.widgets import DataTable

from tui.format import number, sparkline
from tui.run import RunState
from tui.text import plain_name, shorten_middle

SPARK_WIDTH = 20  # the history's columns when there is room
HISTORY_SHORT = "history"  # the history's header in a narrow column
SPARK_MIN = 8  # ... at least: it gives way first, so that names stay readable
#: (key, label, width); the layer's and the history's widths are fitted (``fit_widths``).
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("layer", "layer", 5),
    ("grad", "grad norm", 9),
    ("history", "grad history (log)", SPARK_WIDTH),
    ("param", "param norm", 10),
    ("update", "update/w", 8),
    ("status", "status", 10),
)
#: Shown after the others, once the run has measured it (sampled steps) and where the
#: names stay whole and the history keeps ``SPARK_MIN``: the first to give way.
PEAK_COLUMN: tuple[str, str, int] = ("max", "grad max", 9)
NAME_WIDTH = 40  # longer layer names are shortened in the middle
NAME_MIN = 12  # characters of a name kept at least (the table scrolls sideways below)
CELL_PADDING = 2  # a DataTable cell's padding, both sides
SCROLL_BAR = 2  # the vertical scroll bar of a deep model
VISIBLE_MARGIN = 5  # rows above and below the screen kept up to date too
UNLAID_ROWS = 100  # rows filled before the table has a size
STATUS_STYLE = {
    "non_finite": "bold red",
    "exploding": "red",
    "vanishing": "yellow",
    "none_grad": "magenta",
    "dead": "bright_black",
}


class LayerTable(DataTable[Text | str]):
    """One row per layer, in the model's order; scrolls for deep models."""

    DEFAULT_CSS = """
    LayerTable {
        height: auto;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._layers: list[str] = []
        self._shown: dict[tuple[str, str], str] = {}  # what each cell shows (plain text)
        self._run: RunState | None = None
        # (name, history) widths the columns have, and is the peak column there
        self._widths: tuple[int, int, bool] = (0, 0, False)

    def on_mount(self) -> None:
        self._add_columns(NAME_WIDTH, SPARK_WIDTH)

    def on_resize(self) -> None:
        """Refit the name and history columns to the new width (only then: the values
        change at the app's tick, with the other views')."""
        fit = fit_widths(self.outer_size.width, self._labels(self._run), _peaks(self._run))
        if fit != self._widths:
            self.show(self._run)

    def _add_columns(self, name_width: int, spark_width: int, peaks: bool = False) -> None:
        self._widths = (name_width, spark_width, peaks)
        fitted = {"layer": name_width, "history": spark_width}
        for key, label, width in (*COLUMNS, PEAK_COLUMN) if peaks else COLUMNS:
            if key == "history" and spark_width < len(label):
                label = HISTORY_SHORT  # (a header cut mid-word says less)
            self.add_column(label, key=key, width=fitted.get(key, width))

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's per-layer arrays: the rows on screen (a model with
        thousands of layers would cost most of a core at 8 frames a second); the others
        as they scroll into view."""
        self._run = run
        layers = run.layers if run is not None else []
        # (the scroll bar too)
        widths = fit_widths(self.outer_size.width, self._labels(run), _peaks(run))
        if layers != self._layers or widths != self._widths:
            self.clear(columns=widths != self._widths)
            if not self.columns:
                self._add_columns(*widths)
            self._shown.clear()
            self._layers = list(layers)
            empty = ("-", "", "-", "-", "", "-") if widths[2] else ("-", "", "-", "-", "")
            for name in layers:
                self.add_row(Text(self._layer_label(name)), *empty, key=name)
        if run is not None:
            self._fill(run)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._run is not None and round(old_value) != round(new_value):
            self._fill(self._run)

    def _fill(self, run: RunState) -> None:
        layers = self._layers
        first = max(int(self.scroll_y) - VISIBLE_MARGIN, 0)
        height = self.size.height or UNLAID_ROWS  # before the first layout: a screenful
        last = min(first + height + 2 * VISIBLE_MARGIN, len(layers))
        status = run.layer_status()
        for i in range(first, last):
            name = layers[i]
            grad = _at(run.grad_norms, i)
            history = run.grad_history(i)
            spark_width = self._widths[1]
            style = STATUS_STYLE.get(status.get(name, ""), "")
            label = run.info.layer_label(name)  # tied weights: every name sharing them
            self._set(name, "layer", Text(self._layer_label(label), style=style))
            self._set(name, "grad", _value_text(grad))
            self._set(name, "history", Text(sparkline(history, spark_width), "cyan"))
            self._set(name, "param", Text(number(_at(run.param_norms, i))))
            self._set(name, "update", Text(number(_at(run.update_ratios, i), 2)))
            self._set(name, "status", Text(status.get(name, "").replace("_", " "), style=style))
            if self._widths[2]:
                self._set(name, "max", _value_text(_at(run.grad_max, i)))

    def _set(self, row: str, column: str, text: Text) -> None:
        """Update a cell only when what it shows changed (a deep model has many)."""
        key = (row, column)
        shown = f"{text.plain}|{text.style}"
        if self._shown.get(key) != shown:
            self._shown[key] = shown
            self.update_cell(row, column, text)

    def row_text(self, layer: str) -> list[str]:
        """The plain text of one layer's row (for tests and captures)."""
        return [str(cell) for cell in self.get_row(layer)]

    @staticmethod
    def _labels(run: RunState | None) -> list[str]:
        """Every layer's name as it would show whole (a tied layer with its aliases)."""
        if run is None:
            return []
        return [plain_name(run.info.layer_label(name)) for name in run.layers]

    def _layer_label(self, layer: str) -> str:
        """A layer's name as its column shows it: shortened from the middle to fit
        (the alert detail has it whole)."""
        return shorten_middle(plain_name(layer), self._widths[0])


def fit_widths(width: int, names: list[str], peaks: bool = False) -> tuple[int, int, bool]:
    """The widths of the name and history columns in a table ``width`` wide, so that
    every column stays on screen: the history gives way (to ``SPARK_MIN``) before
    names are shortened (to ``NAME_MIN``); an unlaid table (``width`` 0) gets both
    whole. The third: whether the peak column (``peaks``: the run measures it) is
    shown, only where it leaves the names whole and the history its minimum."""
    longest = min(max((len(name) for name in names), default=5), NAME_WIDTH)
    longest = max(longest, len("layer"))
    if width <= 0:
        return longest, SPARK_WIDTH, peaks
    fixed = sum(w for key, _, w in COLUMNS if key not in ("layer", "history"))
    room = width - SCROLL_BAR - CELL_PADDING * len(COLUMNS) - fixed  # name and history
    peak_room = PEAK_COLUMN[2] + CELL_PADDING
    if peaks and room - peak_room >= longest + SPARK_MIN:
        room -= peak_room
    else:
        peaks = False
    spark = max(min(SPARK_WIDTH, room - longest), SPARK_MIN)
    name = min(longest, max(room - spark, NAME_MIN))
    return name, spark, peaks


def _peaks(run: RunState | None) -> bool:
    """Has the run measured its gradients' largest elements (sampled steps)?"""
    return run is not None and any(value is not None for value in run.grad_max)


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` shortened from the middle to ``width`` (``tui.text.shorten_middle``)."""
    return shorten_middle(name, width)


def _at(values: list[float | None], index: int) -> float | None:
    return values[index] if index < len(values) else None


def _value_text(value: float | None) -> Text:
    if value is None:
        return Text("none", style="magenta")
    if not math.isfinite(value):
        return Text(number(value), style="bold red")
    return Text(number(value))
