"""Per-layer gradient table: layer, grad norm, its recent history, param norm."""

from __future__ import annotations

import math

from rich.text import Text
from textual.widgets import DataTable

from tui.format import number, sparkline
from tui.state import RunState

SPARK_WIDTH = 24
#: (key, label, width); None sizes the column to its content.
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("layer", "layer", None),
    ("grad", "grad norm", 10),
    ("history", "grad norm history (log)", SPARK_WIDTH),
    ("param", "param norm", 10),
)


class LayerTable(DataTable[Text | str]):
    """One row per layer, in the model's order; scrolls for deep models."""

    DEFAULT_CSS = """
    LayerTable {
        height: auto;
        max-height: 60%;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._layers: list[str] = []

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's per-layer arrays."""
        layers = run.layers if run is not None else []
        if layers != self._layers:
            self.clear()
            self._layers = list(layers)
            for name in layers:
                self.add_row(name, "-", "", "-", key=name)
        if run is None:
            return
        for i, name in enumerate(layers):
            grad = run.grad_norms[i] if i < len(run.grad_norms) else None
            param = run.param_norms[i] if i < len(run.param_norms) else None
            history = run.grad_history[i] if i < len(run.grad_history) else []
            self.update_cell(name, "grad", _value_text(grad))
            self.update_cell(name, "history", Text(sparkline(history, SPARK_WIDTH), "cyan"))
            self.update_cell(name, "param", number(param))

    def row_text(self, layer: str) -> list[str]:
        """The plain text of one layer's row (for tests and captures)."""
        return [str(cell) for cell in self.get_row(layer)]


def _value_text(value: float | None) -> Text:
    if value is None:
        return Text("none", style="magenta")
    if not math.isfinite(value):
        return Text(number(value), style="bold red")
    return Text(number(value))
