"""An anomaly step's report: the backward op, the first non-finite module, the trace.

The report is the training process's own text (module names, file names, source lines):
every part of it is shown as plain text.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from probes.kernel.wire import Frame
from tui.format import number
from tui.screens.panel import PanelScreen
from tui.text import plain_line, plain_name

TRACE_FRAMES = 40  # frames of a forward traceback shown (the innermost last)
OUTCOME_TEXT = {
    "clean": ("clean: no non-finite value in the forward or the backward", "green"),
    "non_finite_backward": ("a backward op produced a NaN: the update was skipped", "bold red"),
    "non_finite_forward": ("a module's forward output is non-finite", "bold red"),
    "error": ("the step raised an error", "bold red"),
}


class AnomalyReportScreen(PanelScreen):
    """Modal view of one anomaly report; Escape or q closes it."""

    BINDINGS = [Binding("escape,q,v", "dismiss", "Close")]
    DEFAULT_CSS = """
    AnomalyReportScreen > VerticalScroll {
        width: 95%;
        max-width: 130;
        max-height: 95%;
        border: thick $error;
    }
    """

    def __init__(self, report: Frame) -> None:
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._headline(), id="headline")
            yield Static(self._culprit(), id="culprit")
            first = self.report.get("first_non_finite")
            if first:
                yield Static(module_table(first), id="first-module")
            yield Static(traceback_text(self.report.get("forward_traceback") or []), id="traceback")
            yield Static(Text("Escape closes.", style="dim"))

    def _headline(self) -> Text:
        report = self.report
        outcome, style = OUTCOME_TEXT.get(str(report.get("outcome")), ("?", ""))
        text = Text(f"Anomaly step {plain_name(report.get('step'))}", style="bold")
        text.append(f"  ({number(report.get('duration'), 3)} s)\n", style="dim")
        text.append(outcome, style=style)
        if report.get("batch") is not None:
            text.append(f"\nbatch {plain_line(report['batch'])}")
        if report.get("update_skipped"):
            text.append("\nweights untouched: optimizer.step() did not run", style="yellow")
        if report.get("paused"):
            text.append("\nthe run is paused: p resumes, n steps, a arms another anomaly step")
        return text

    def _culprit(self) -> Text:
        report = self.report
        text = Text()
        op = report.get("backward_op")
        if op:
            text.append("backward op  ", style="bold")
            text.append(f"{plain_name(op)}\n", style="bold red")
            module = report.get("module_of_backward_op")
            text.append("in module    ", style="bold")
            text.append(f"{plain_name(module) if module else '(not found in the model)'}\n")
        first = report.get("first_non_finite")
        if first:
            text.append("first non-finite forward output  ", style="bold")
            text.append(
                f"{plain_name(first['name'])} ({plain_name(first.get('type'))})", style="bold red"
            )
        elif op:
            text.append("forward outputs all finite: the NaN was born in the backward", style="dim")
        return text


def module_table(first: dict[str, Any]) -> Table:
    """Input and output statistics of the first module with a non-finite output (its
    cells plain text, not markup)."""
    title = Text(f"{plain_name(first['name'])}: inputs finite, output not", "table.title")
    table = Table(title=title, title_justify="left")
    keys = ["shape", "min", "max", "mean", "abs_max", "nan", "inf", "zeros"]
    table.add_column("tensor")
    for key in keys:
        table.add_column(key, justify="right")
    inputs = first.get("inputs")
    rows = [
        (f"input {i}", stats) for i, stats in enumerate(inputs if isinstance(inputs, list) else [])
    ]
    rows.append(("output", first.get("output") or {}))
    for label, stats in rows:
        got = stats if isinstance(stats, dict) else {}
        table.add_row(label, *(Text(_cell(got.get(key))) for key in keys))
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return number(value, 3)
    if isinstance(value, list):
        return plain_name("x".join(str(v) for v in value[:16]))
    return "-" if value is None else plain_name(value)


def traceback_text(frames: list[dict[str, Any]]) -> Text:
    """The forward traceback of the blamed op, your frames only."""
    text = Text("Forward traceback (your code)\n", style="bold")
    if not frames:
        text.append("  none recorded", style="dim")
    for frame in frames[-TRACE_FRAMES:] if isinstance(frames, list) else []:
        where = frame if isinstance(frame, dict) else {}
        text.append(
            f"  {plain_line(where.get('file'))}:{plain_name(where.get('line'))}"
            f" in {plain_name(where.get('function'))}\n",
            style="cyan",
        )
        text.append(f"      {plain_line(where.get('code', ''))}\n")
    return text
