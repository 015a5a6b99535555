"""The gradient heatmap: layers down, steps across, log10 of each cell's largest norm.

Each cell is a bar whose height and colour both give the level (a plain-text capture
still reads), over a scale fitted to the run; non-finite cells are a red ``!``, exact
zeros a ``0``, cells without a gradient a ``·``. The whole run is shown at an even
resolution (``GradHeatmap.resample``); deep models scroll.
"""

from __future__ import annotations

import math
import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.css.scalar import Scalar
from textual.timer import Timer
from textual.widgets import Static

from tui.format import number
from tui.heatmap import MISSING
from tui.run import RunState
from tui.text import plain_name, shorten_middle

BARS = "▁▂▃▄▅▆▇█"
# viridis, low to high: dark to bright, readable on a dark or a light background
COLORS = ("#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725")
NON_FINITE_STYLE = "bold white on red"
NAME_WIDTH_MAX = 20
REDRAW_EVERY_S = 1.0


class GradHeatmapView(Vertical):
    """Layers x steps of log10 gradient norm for the selected run (``h`` toggles)."""

    DEFAULT_CSS = """
    GradHeatmapView {
        height: 1fr;
        display: none;
    }
    GradHeatmapView #heat-rows-scroll {
        height: auto;
    }
    GradHeatmapView #heat-legend, GradHeatmapView #heat-axis {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.legend_text = ""  # plain text of the legend, axis and rows (tests, captures)
        self.axis_text = ""
        self.rows_text: list[str] = []
        self.scale: tuple[float, float] | None = None  # log10 range of the colours
        self._shown: tuple[object, ...] | None = None  # the run and size last drawn
        self._drawn_at = 0.0
        self._catch_up: Timer | None = None  # a redraw held back by the rate limit

    def compose(self) -> ComposeResult:
        yield Static(id="heat-legend")
        with VerticalScroll(id="heat-rows-scroll"):
            yield Static(id="heat-rows")
        yield Static(id="heat-axis")

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's heatmap buckets, fitted to the widget's width; at most
        once a second while the same run and size are shown (a column covers many steps,
        and a model of thousands of layers costs a redraw of every row)."""
        if not self.display:
            self._shown = None
            return
        now = time.monotonic()
        shape = (id(run), self.size, run.heatmap.stride if run else 0)
        if shape == self._shown and now - self._drawn_at < REDRAW_EVERY_S:
            if self._catch_up is None:  # draw what came meanwhile, once it is time
                self._catch_up = self.set_timer(
                    self._drawn_at + REDRAW_EVERY_S - now, lambda: self._draw_late(run)
                )
            return
        self._shown, self._drawn_at = shape, now
        width = self.size.width or 80
        layers = [plain_name(name) for name in run.layers] if run is not None else []
        longest = max((len(name) for name in layers), default=5)
        name_width = min(longest, NAME_WIDTH_MAX, max(width // 4, 8))  # shortened in the middle
        cells = max(width - name_width - 3, 4)  # a space after the names; a scroll bar
        heat = run.heatmap if run is not None else None
        if heat is None or heat.columns == 0:
            self.query_one("#heat-legend", Static).update(
                Text("grad norm heatmap: no gradients yet", style="dim")
            )
            self.query_one("#heat-rows", Static).update("")
            self.query_one("#heat-axis", Static).update("")
            self.legend_text, self.axis_text, self.rows_text = "", "", []
            return
        grid = heat.resample(cells)
        self.scale = _scale(grid)
        marks = {mark for row in grid for mark in _marks(row)}
        rows = Text(no_wrap=True, overflow="crop")
        self.rows_text = []
        for index, (name, values) in enumerate(zip(layers, grid, strict=True)):
            line = _row(shorten_middle(name, name_width).ljust(name_width), values, self.scale)
            self.rows_text.append(line.plain)
            rows.append_text(line)
            if index < len(layers) - 1:
                rows.append("\n")
        first, _ = heat.column_steps(0)
        last = min(heat.column_steps(heat.columns - 1)[1], run.last_step if run else 0)
        legend = _legend(self.scale, marks, (last - first + 1) / cells)
        axis = _axis(first, last, name_width + 1, cells)
        self.legend_text, self.axis_text = legend.plain, axis
        self.query_one("#heat-legend", Static).update(legend)
        self.query_one("#heat-rows", Static).update(rows)
        room = max((self.size.height or len(layers) + 2) - 2, 1)  # under legend, over axis
        scroll = self.query_one("#heat-rows-scroll", VerticalScroll)
        if scroll.styles.height != Scalar.parse(str(min(len(layers), room))):
            scroll.styles.height = min(len(layers), room)
        self.query_one("#heat-axis", Static).update(Text(axis, style="dim"))

    def _draw_late(self, run: RunState | None) -> None:
        self._catch_up = None
        self._shown = None  # whatever was drawn, draw again
        self.show(run)


def _scale(grid: list[list[float]]) -> tuple[float, float]:
    """The log10 range of the finite, positive cells (a tiny range is widened)."""
    logs = [math.log10(v) for row in grid for v in row if 0 < v < math.inf]
    if not logs:
        return (0.0, 1.0)
    low, high = min(logs), max(logs)
    if high - low < 1e-9:
        return (low - 0.5, high + 0.5)
    return (low, high)


def level(value: float, scale: tuple[float, float]) -> int:
    """Which of the ``len(BARS)`` levels a positive finite norm falls in."""
    low, high = scale
    fraction = (math.log10(value) - low) / (high - low)
    return min(max(int(fraction * len(BARS)), 0), len(BARS) - 1)


def _marks(row: list[float]) -> set[str]:
    out = set()
    for value in row:
        if value == math.inf:
            out.add("!")
        elif value == 0:
            out.add("0")
        elif value == MISSING:
            out.add("·")
    return out


def _row(name: str, values: list[float], scale: tuple[float, float]) -> Text:
    text = Text(name + " ", no_wrap=True)
    run, run_style = "", ""  # cells of one style are appended together: fewer spans
    for value in values:
        if value == math.inf:
            cell, style = "!", NON_FINITE_STYLE
        elif value == MISSING:
            cell, style = "·", "dim"
        elif value <= 0:
            cell, style = "0", "dim"
        else:
            bar = level(value, scale)
            cell, style = BARS[bar], COLORS[bar]
        if style != run_style and run:
            text.append(run, style=run_style)
            run = ""
        run, run_style = run + cell, style
    if run:
        text.append(run, style=run_style)
    return text


def _legend(scale: tuple[float, float], marks: set[str], steps_per_cell: float) -> Text:
    low, high = scale
    text = Text("grad norm ", style="bold")
    for bar, color in zip(BARS, COLORS, strict=True):
        text.append(bar, style=color)
    text.append(f" {number(10**low, 2)}…{number(10**high, 2)} (log)")
    if "!" in marks:
        text.append("  ")
        text.append("!", style=NON_FINITE_STYLE)
        text.append(" non-finite")
    if "0" in marks:
        text.append("  0 zero", style="dim")
    if "·" in marks:
        text.append("  · none", style="dim")
    if steps_per_cell >= 1.5:  # else a cell is a step (or part of one): nothing to say
        span = f"{steps_per_cell:.0f}" if steps_per_cell >= 10 else f"{steps_per_cell:.2g}"
        text.append(f"  max of each cell (~{span} steps)", style="dim")
    return text


def _axis(first: int, last: int, indent: int, cells: int) -> str:
    """The step axis under the cells: first, middle and last step."""
    line = [" "] * (indent + cells)
    labels = [
        (indent, f"{first:,}"),
        (indent + cells // 2, f"{(first + last) // 2:,}"),
        (indent + cells, f"{last:,}"),
    ]
    for position, label in labels:
        start = min(max(position - len(label) // 2, indent), indent + cells - len(label))
        if position == indent:
            start = indent
        if position == indent + cells:
            start = indent + cells - len(label)
        if all(c == " " for c in line[max(start - 1, 0) : start + len(label) + 1]):
            line[start : start + len(label)] = label
    return "".join(line).rstrip()
