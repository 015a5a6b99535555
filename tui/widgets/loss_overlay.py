"""Several runs' training losses on one step axis, one colour each, with a legend."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tui.format import axis_ticks, downsample, number, wants_log_scale
from tui.run import RunState
from tui.text import plain_line
from tui.widgets.loss_chart import LEGEND_LIMIT, SMOOTHING, _log_points, ema

# (plotext's name, Rich's name) of one colour: the chart's line and the table's text
RUN_COLORS = (
    ("cyan", "cyan"),
    ("orange", "dark_orange"),
    ("magenta", "magenta"),
    ("green", "green"),
    ("yellow", "yellow"),
    ("blue", "blue"),
    ("red", "red"),
    ("white", "white"),
)


def run_color(index: int) -> str:
    """The colour of the ``index``-th run of a comparison, as a Rich style (the table's
    and the header's; the chart draws the same colour)."""
    return RUN_COLORS[index % len(RUN_COLORS)][1]


def _plot_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)][0]


class LossOverlay(PlotextPlot):
    """The smoothed training loss of each compared run; log scale when it spans more
    than one and a half decades; a run's first non-finite loss is a line in its colour."""

    DEFAULT_CSS = """
    LossOverlay {
        height: 1fr;
        min-height: 8;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.plotted: dict[str, list[float]] = {}  # run name -> y values drawn

    def show(self, runs: list[RunState]) -> None:
        """Redraw from the runs' loss series."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel("step")
        self.plotted = {}
        lines = []
        for index, run in enumerate(runs):
            series = run.scalars.get("loss")
            if series is None:
                continue
            xs, ys = series.points()
            lines.append(
                (
                    plain_line(run.name, LEGEND_LIMIT),  # (the legend: plain and short)
                    _plot_color(index),
                    xs,
                    ema(ys, SMOOTHING),
                    series.first_non_finite_x(),
                )
            )
        every_y = [y for line in lines for y in line[3]]
        log = wants_log_scale(every_y)
        limit = max(2 * self.size.width, 16)
        drawn: list[float] = []
        last_step = max((run.last_step for run in runs), default=0)
        for name, color, xs, ys, bad_x in lines:
            if log:
                xs, ys = _log_points(xs, ys)
            xs, ys = downsample(xs, ys, limit)
            if xs:
                plt.plot(
                    xs, ys, label=name, color=color, marker="braille" if len(xs) > 1 else "dot"
                )
                self.plotted[name] = ys
                drawn += ys
            if bad_x is not None:
                plt.vline(bad_x, color)
        plt.title(
            "train loss, smoothed"
            + (", log scale" if log else "")
            + (
                "; a vertical line: the run's first non-finite loss"
                if any(line[4] is not None for line in lines)
                else ""
            )
        )
        if last_step > 0:
            plt.xlim(0, last_step)
            steps: list[float] = sorted({round(t) for t in axis_ticks(0, last_step, 5)})
            plt.xticks(steps, [f"{t:,}" for t in steps])
        if drawn:
            ticks = axis_ticks(min(drawn), max(drawn), 4)
            plt.yticks(ticks, [number(10**t if log else t, 3) for t in ticks])
        self.refresh()
