"""Per-layer gradient table: layer, grad norm, its recent history, param norm."""

from __future__ import annotations

import math

from rich.text import Text
from textual.widgets import DataTable

from tui.format import number, sparkline
from tui.run import RunState
from tui.text import plain_name

SPARK_WIDTH = 20
#: (key, label, width); None sizes the column to its content.
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("layer", "layer", None),
    ("grad", "grad norm", 9),
    ("history", "grad history (log)", SPARK_WIDTH),
    ("param", "param norm", 10),
    ("update", "update/w", 9),
    ("status", "status", 10),
)
NAME_WIDTH = 40  # longer layer names are shortened in the middle
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

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's per-layer arrays: the rows on screen (a model with
        thousands of layers would cost most of a core at 8 frames a second); the others
        as they scroll into view."""
        self._run = run
        layers = run.layers if run is not None else []
        if layers != self._layers:
            self.clear()
            self._shown.clear()
            self._layers = list(layers)
            for name in layers:
                self.add_row(Text(short_name(plain_name(name))), "-", "", "-", "-", "", key=name)
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
            style = STATUS_STYLE.get(status.get(name, ""), "")
            label = run.info.layer_label(name)  # tied weights: every name sharing them
            self._set(name, "layer", Text(short_name(plain_name(label)), style=style))
            self._set(name, "grad", _value_text(grad))
            self._set(name, "history", Text(sparkline(history, SPARK_WIDTH), "cyan"))
            self._set(name, "param", Text(number(_at(run.param_norms, i))))
            self._set(name, "update", Text(number(_at(run.update_ratios, i), 2)))
            self._set(name, "status", Text(status.get(name, "").replace("_", " "), style=style))

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


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name``, or its start and end around an ellipsis when longer than ``width``
    (the end names the layer; the start, the block it belongs to)."""
    if len(name) <= width:
        return name
    tail = (width - 1) * 2 // 3
    return name[: width - 1 - tail] + "…" + name[-tail:]


def _at(values: list[float | None], index: int) -> float | None:
    return values[index] if index < len(values) else None


def _value_text(value: float | None) -> Text:
    if value is None:
        return Text("none", style="magenta")
    if not math.isfinite(value):
        return Text(number(value), style="bold red")
    return Text(number(value))
