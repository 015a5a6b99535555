"""Where the step's time and memory go: beside the loss chart, on a wide terminal.

``TimeChart``: the seconds a step spends in each phase (``tui.resources.PHASES``), as
stacked bars over the steps, the data wait on top (a run that waits on its input shows
a tall top band); ``MemoryChart``: the bytes in use at each record's end. Both draw
from the run's ``RunResources`` and hold nothing of their own; ``ResourceViews`` holds
the two, one over the other, and shows those the run measures (none: it is hidden, and
the loss chart keeps the row: ``tui.layout.resource_columns``).
"""

from __future__ import annotations

from itertools import pairwise

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual_plotext import PlotextPlot

from tui.format import axis_ticks, downsample, seconds_short
from tui.layout import resource_columns
from tui.resources import PHASE_WORDS, PHASES, RunResources, byte_size
from tui.run import RunState

#: Each phase's colour (plotext's name, and rich's for the legend): the data wait in
#: the warning's orange, the probe's own time grey.
PHASE_COLORS = {
    "forward": ("blue", "blue"),
    "backward": ("magenta", "magenta"),
    "optimizer": ("green", "green"),
    "probe": ("gray", "grey50"),
    "other": ("white", "white"),
    "data": ("orange", "dark_orange"),
}
#: ... and its mark, so that a plain-text capture (or a terminal without colour) still
#: tells the phases apart: the data wait light, the compute dark.
PHASE_MARKS = {
    "forward": "█",
    "backward": "▓",
    "optimizer": "▒",
    "probe": ":",
    "other": "·",
    "data": "░",
}
LEGEND_ORDER = ("data", "forward", "backward", "optimizer", "other", "probe")  # (cut from its end)
MEMORY_COLOR = "cyan"
BAR_COLUMNS = 2  # columns a bar takes at least (the time chart bins steps to fit)


def binned(resources: RunResources, bars: int) -> tuple[list[float], dict[str, list[float]]]:
    """At most ``bars`` bars: each bin's last step and each phase's mean seconds a step
    over the bin (the series' points, in order, split evenly)."""
    xs, _ = resources.phases[PHASES[0]].points()
    columns = {name: resources.phases[name].points()[1] for name in PHASES}
    count = min(len(xs), len(min(columns.values(), key=len)))
    if not count or bars < 1:
        return [], {name: [] for name in PHASES}
    edges = [round(i * count / min(bars, count)) for i in range(min(bars, count) + 1)]
    steps = [xs[end - 1] for end in edges[1:]]
    means = {
        name: [sum(ys[a:b]) / (b - a) for a, b in pairwise(edges)] for name, ys in columns.items()
    }
    return steps, means


def _legend(title: str, entries: list[tuple[str, str, str]], width: int) -> Text:
    """``title  ░░ data  ██ fwd ...`` as the chart's border subtitle, entries dropped from
    the end until it fits ``width`` columns."""
    while True:
        text = Text(f" {title}")
        for label, style, mark in entries:
            text.append("  ")
            text.append(mark, style=style)
            text.append(f" {label}")
        text.append(" ")
        if len(text.plain) + 2 <= width or not entries:
            return text
        entries = entries[:-1]


class RunChart(PlotextPlot):
    """A chart of one run's series: drawn again, from the run it last showed, when it is
    laid out at another width (``ResourceViews.fit`` resizes it after the redraw it asked
    for), since what it draws is binned or sampled for its width."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.title_text = ""  # the title and legend as shown (tests, captures)
        self._run: RunState | None = None  # the run last shown

    def on_resize(self) -> None:
        if self._run is not None:
            self.show(self._run)

    def show(self, run: RunState | None) -> None:
        """Redraw from ``run``."""
        self._run = run


class TimeChart(RunChart):
    """Seconds a step by phase, stacked, over the steps (the data wait on top)."""

    DEFAULT_CSS = """
    TimeChart {
        height: 1fr;
        border-bottom: solid $panel;
        border-subtitle-align: center;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.bars: dict[str, list[float]] = {}  # phase -> seconds a step, each bar drawn
        self.drawn_width = 0  # the width the bars were binned for

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's phases."""
        super().show(run)
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        self.bars = {}
        resources = None if run is None else run.resources
        if resources is not None and resources.timed:
            width = self.drawn_width = self.size.width or 60
            steps, means = binned(resources, max((width - 8) // BAR_COLUMNS, 1))
            if steps:
                # one colour and mark a series: plotext takes lists here (its
                # draw_stacked_bar), though its annotations say one value
                plt.stacked_bar(
                    steps,
                    [means[name] for name in PHASES],
                    color=[PHASE_COLORS[name][0] for name in PHASES],  # type: ignore[arg-type]
                    marker=[PHASE_MARKS[name] for name in PHASES],  # type: ignore[arg-type]
                    width=0.8,
                )
                self.bars = means
                tops = [sum(column) for column in zip(*means.values(), strict=True)]
                ticks = axis_ticks(0.0, max(tops) or 1.0, 4)
                plt.yticks(ticks, [seconds_short(t) for t in ticks])
                labels = sorted({round(t) for t in axis_ticks(steps[0], steps[-1], 4)})
                plt.xticks([float(t) for t in labels], [f"{t:,}" for t in labels])
        entries = [
            (PHASE_WORDS[name], PHASE_COLORS[name][1], PHASE_MARKS[name] * 2)
            for name in LEGEND_ORDER
        ]
        title = _legend("time/step", entries, self.size.width or 60)
        self.title_text = title.plain
        self.border_subtitle = title
        self.refresh()


class MemoryChart(RunChart):
    """The memory in use at each record's end, over the steps."""

    DEFAULT_CSS = """
    MemoryChart {
        height: 1fr;
        border-bottom: solid $panel;
        border-subtitle-align: center;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.plotted: list[float] = []  # the bytes drawn

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's memory series."""
        super().show(run)
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        self.plotted = []
        source = "" if run is None or run.info.memory_source is None else run.info.memory_source
        if run is not None and len(run.resources.memory):
            xs, ys = downsample(*run.resources.memory.points(), max(2 * self.size.width, 16))
            plt.plot(xs, ys, color=MEMORY_COLOR, marker="braille" if len(xs) > 1 else "dot")
            self.plotted = ys
            ticks = axis_ticks(min(ys), max(ys), 4)
            plt.yticks(ticks, [byte_size(t) for t in ticks])
            if run.last_step > 0:
                labels = sorted({round(t) for t in axis_ticks(0, run.last_step, 4)})
                plt.xlim(0, run.last_step)
                plt.xticks([float(t) for t in labels], [f"{t:,}" for t in labels])
        title = "memory" + (f" ({source})" if source else "")
        text = _legend(title, [], self.size.width or 60)
        self.title_text = text.plain
        self.border_subtitle = text
        self.refresh()


class ResourceViews(Vertical):
    """The time chart over the memory chart, each shown when the run measures it."""

    DEFAULT_CSS = """
    ResourceViews {
        display: none;
        border-left: solid $panel;
    }
    """

    def compose(self) -> ComposeResult:
        yield TimeChart(id="time")
        yield MemoryChart(id="memory")

    def fit(self, run: RunState | None, width: int, chart_rows: int) -> bool:
        """Show the view, and its width, for this run and the terminal's size
        (``tui.layout.resource_columns``); True when that changed (a redraw is due)."""
        measured = run is not None and run.resources.measured
        columns = resource_columns(width, chart_rows, measured=measured)
        shown = (self.display, self.styles.width)
        self.display = columns > 0
        if columns:
            self.styles.width = columns
        return shown != (self.display, self.styles.width)

    def show(self, run: RunState | None) -> None:
        """Redraw the charts the run has data for (none while the view is hidden)."""
        if not self.display:
            return
        time_chart, memory_chart = self.query_one(TimeChart), self.query_one(MemoryChart)
        resources = None if run is None else run.resources
        time_chart.display = resources is not None and resources.timed
        memory_chart.display = resources is not None and len(resources.memory) > 0
        for chart in (time_chart, memory_chart):
            if chart.display:
                chart.show(run)
