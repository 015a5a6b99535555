"""An anomaly step's report: the backward op, the first non-finite module, the trace."""

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
        text = Text(f"Anomaly step {report.get('step')}", style="bold")
        text.append(f"  ({number(report.get('duration'), 3)} s)\n", style="dim")
        text.append(outcome, style=style)
        if report.get("batch") is not None:
            text.append(f"\nbatch {report['batch']}")
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
            text.append(f"{op}\n", style="bold red")
            module = report.get("module_of_backward_op")
            text.append("in module    ", style="bold")
            text.append(f"{module or '(not found in the model)'}\n")
        first = report.get("first_non_finite")
        if first:
            text.append("first non-finite forward output  ", style="bold")
            text.append(f"{first['name']} ({first['type']})", style="bold red")
        elif op:
            text.append("forward outputs all finite: the NaN was born in the backward", style="dim")
        return text


def module_table(first: dict[str, Any]) -> Table:
    """Input and output statistics of the first module with a non-finite output."""
    table = Table(title=f"{first['name']}: inputs finite, output not", title_justify="left")
    keys = ["shape", "min", "max", "mean", "abs_max", "nan", "inf", "zeros"]
    table.add_column("tensor")
    for key in keys:
        table.add_column(key, justify="right")
    rows = [(f"input {i}", stats) for i, stats in enumerate(first.get("inputs") or [])]
    rows.append(("output", first.get("output") or {}))
    for label, stats in rows:
        table.add_row(label, *(_cell(stats.get(key)) for key in keys))
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return number(value, 3)
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return "-" if value is None else str(value)


def traceback_text(frames: list[dict[str, Any]]) -> Text:
    """The forward traceback of the blamed op, your frames only."""
    text = Text("Forward traceback (your code)\n", style="bold")
    if not frames:
        text.append("  none recorded", style="dim")
    for frame in frames:
        text.append(
            f"  {frame.get('file')}:{frame.get('line')} in {frame.get('function')}\n", style="cyan"
        )
        text.append(f"      {frame.get('code', '')}\n")
    return text
