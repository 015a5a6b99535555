"""The loss chart: training and validation curves on one step axis."""

from __future__ import annotations

import math
import re

from rich.text import Text
from textual.reactive import reactive
from textual_plotext import PlotextPlot

from probes.kernel.diagnosis import Severity
from probes.kernel.schema.spec import EventName
from tui.format import axis_ticks, downsample, number, wants_log_scale
from tui.run import RunState
from tui.series import BucketedSeries
from tui.text import plain_line

TRAIN_COLOR = "cyan"
VALIDATION_COLOR = "orange"
#: An evaluation's other losses (a GCN's ``train_loss`` and ``test_loss`` in eval mode,
#: ``val_loss[1]``: ``probes.runtime.evaluation.autoeval``), the first two, in these colours.
OTHER_COLORS = ("green", "blue")
NON_FINITE_COLOR = "red"
SMOOTHING = 0.9
LEGEND_LIMIT = 40  # characters of a name in the legend
LEGEND_MARK = "━━"
#: plotext's colour names as rich styles, for the legend (rich has no "orange")
LEGEND_STYLES = {
    TRAIN_COLOR: "cyan",
    VALIDATION_COLOR: "dark_orange",
    **{color: color for color in OTHER_COLORS},
}
XLABEL_MIN_HEIGHT = 16  # a shorter chart gives the "step" label's row to the curves


class LossChart(PlotextPlot):
    """Train loss (every step) and validation loss (each eval) against the step.

    The y axis turns logarithmic on its own when the loss spans more than one and
    a half decades (``l`` cycles auto, log, linear); a red line marks the first
    non-finite training loss. The title and the legend are the subtitle of the
    border under the chart (``app.tcss``), under the step axis as a figure's legend:
    inside the plot, plotext's legend hid the first steps, and its title took a row.
    """

    DEFAULT_CSS = """
    LossChart {
        height: 1fr;
        border-subtitle-align: center;
    }
    """

    scale: reactive[str] = reactive("auto")  # "auto", "log" or "linear" (l cycles)
    smoothing: reactive[bool] = reactive(True)  # EMA of the train loss (mini-batch noise)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.plotted: dict[str, list[float]] = {}  # line label -> y values drawn
        self.title_text = ""  # the title and legend as shown (for tests and captures)
        self.first_non_finite: float | None = None

    def show(self, run: RunState | None) -> None:
        """Redraw from the run's series."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        if self.size.height >= XLABEL_MIN_HEIGHT or not self.size.height:
            plt.xlabel("step")
        self.plotted = {}
        lines = self._lines(run)
        every_y = [y for _, _, _, ys in lines for y in ys]
        log = self.scale == "log" or (self.scale == "auto" and wants_log_scale(every_y))
        if log:
            lines = [(label, color, *_log_points(xs, ys)) for label, color, xs, ys in lines]
        limit = max(2 * self.size.width, 16)
        for label, color, xs, ys in lines:
            xs, ys = downsample(xs, ys, limit)
            if xs:
                plt.plot(xs, ys, color=color, marker="braille" if len(xs) > 1 else "dot")
                self.plotted[label] = ys
        self._axes(run, [y for _, _, _, ys in lines for y in ys], log)
        legend = [
            (label, LEGEND_STYLES.get(color, color))
            for label, color, _, _ in lines
            if label in self.plotted
        ]
        title = chart_title(
            self.size.width or 80, log, self.smoothing, self.first_non_finite, legend
        )
        self.title_text = title.plain
        self.border_subtitle = title
        self.refresh()

    def _lines(self, run: RunState | None) -> list[tuple[str, str, list[float], list[float]]]:
        if run is None:
            return []
        out = []
        train = run.scalars.get("loss")
        if train is not None:
            xs, ys = train.points()
            if self.smoothing:
                ys = ema(ys, SMOOTHING)
            out.append(("train loss", TRAIN_COLOR, xs, ys))
        validation = run.validation
        if validation is not None:
            val_name, series = validation
            label = f"validation ({plain_line(val_name, LEGEND_LIMIT)})"  # (a run's own name)
            out.append((label, VALIDATION_COLOR, *series.points()))
            for (name, other), color in zip(
                other_losses(run, val_name), OTHER_COLORS, strict=False
            ):
                out.append((f"eval ({plain_line(name, LEGEND_LIMIT)})", color, *other.points()))
        return out

    def _axes(self, run: RunState | None, ys: list[float], log: bool) -> None:
        plt = self.plt
        self.first_non_finite = _first_non_finite(run)
        if self.first_non_finite is not None:
            plt.vline(self.first_non_finite, NON_FINITE_COLOR)
        for step, color in _alert_markers(run) + _lr_markers(run):
            plt.vline(step, color)
        if run is not None and run.last_step > 0:
            plt.xlim(0, run.last_step)
            steps = sorted({round(t) for t in axis_ticks(0, run.last_step, 5)})
            plt.xticks([float(t) for t in steps], [f"{t:,}" for t in steps])
        if ys:
            ticks = axis_ticks(min(ys), max(ys), 5)
            labels = [number(10**t if log else t, 3) for t in ticks]
            plt.yticks(ticks, labels)

    def watch_scale(self) -> None:
        self.refresh()

    def cycle_scale(self) -> None:
        """auto -> log -> linear -> auto."""
        self.scale = {"auto": "log", "log": "linear", "linear": "auto"}[self.scale]


_LOSS_NAME = re.compile(r".*loss(\[\d+\])?", re.IGNORECASE)


def other_losses(run: RunState, validation: str) -> list[tuple[str, BucketedSeries]]:
    """The run's evaluation losses besides the validation loss (``validation``), in the
    order they first came: the other splits of an evaluation (``test_loss``,
    ``val_loss[1]``), or another loss the script logs in it."""
    return [
        (name, series)
        for name, series in run.eval_scalars.items()
        if name != validation and _LOSS_NAME.fullmatch(name)
    ]


def chart_title(
    width: int,
    log: bool,
    smoothed: bool,
    non_finite: float | None,
    legend: list[tuple[str, str]],
) -> Text:
    """The chart's title and legend on one line of ``width`` columns (less its
    corners): ``loss, log scale, train smoothed  (non-finite from step 23)  ━━ train
    loss  ━━ validation (val_loss)``, abbreviated by rule until it fits: the words of
    the title first (``loss, log, smoothed, nan@23``), then the legend's (``train``,
    ``val_loss``); the legend's marks and colours stay."""
    nan_at = None if non_finite is None else int(non_finite)
    long_title = "loss" + (", log scale" if log else "") + (", train smoothed" if smoothed else "")
    long_title += f"  (non-finite from step {nan_at})" if nan_at is not None else ""
    short_title = "loss" + (", log" if log else "") + (", smoothed" if smoothed else "")
    short_title += f", nan@{nan_at}" if nan_at is not None else ""
    short_legend = [(_short_label(label), color) for label, color in legend]
    choices = [(long_title, legend), (short_title, legend), (short_title, short_legend)]
    choices.append(("loss", short_legend))
    for title, entries in choices:
        text = Text(f" {title}")
        for label, color in entries:
            text.append("  ")
            text.append(LEGEND_MARK, style=color)
            text.append(f" {label}")
        text.append(" ")  # (apart from the border's line)
        if len(text.plain) + 2 <= width:
            return text
    return text


def _short_label(label: str) -> str:
    """``train`` for the train loss; a validation (or other evaluation) loss by its own
    name."""
    for kind in ("validation (", "eval ("):
        if label.startswith(kind) and label.endswith(")"):
            return label[len(kind) : -1]
    return label.removesuffix(" loss")


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average, as TensorBoard's smoothing slider (bias-corrected)."""
    out: list[float] = []
    average = 0.0
    for count, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**count))
    return out


def _log_points(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    kept = [(x, math.log10(y)) for x, y in zip(xs, ys, strict=True) if y > 0]
    return [k[0] for k in kept], [k[1] for k in kept]


ALERT_COLORS = {severity: severity.colour for severity in Severity}
MAX_MARKERS = 24


def _alert_markers(run: RunState | None) -> list[tuple[int, str]]:
    """(step, colour) of each alert raised, most recent ``MAX_MARKERS``, one per step."""
    if run is None:
        return []
    marks: dict[int, str] = {}
    for entry in run.alerts[-MAX_MARKERS:]:
        marks.setdefault(entry.alert.step, ALERT_COLORS.get(entry.alert.severity, "yellow"))
    return list(marks.items())


LR_COLOR = "magenta"


def _lr_markers(run: RunState | None) -> list[tuple[int, str]]:
    """(step, colour) of each learning-rate experiment run from the monitor."""
    if run is None:
        return []
    return [
        (int(e.get("step", 0)), LR_COLOR) for e in run.events if e.get("name") == EventName.LR_SCALE
    ][-MAX_MARKERS:]


def _first_non_finite(run: RunState | None) -> float | None:
    series: BucketedSeries | None = None if run is None else run.scalars.get("loss")
    return None if series is None else series.first_non_finite_x()
