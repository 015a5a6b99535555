"""The ? screen: every key, and what the controls do to the run."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.screens.panel import PanelScreen

KEYS = (
    ("p", "pause the run at the next step boundary, or resume it"),
    ("n", "while paused: run exactly one step"),
    ("a", "run the next step under torch.autograd.detect_anomaly (3a: the next three);"
          " while paused, it runs now"),
    ("v", "view the last anomaly report"),
    ("c", "view the reports of the data and batch checks (check_split, ...)"),
    ("g", "guard on/off: non-finite gradients skip optimizer.step() and pause (one sync "
          "a step)"),
    ("-  +", "learning-rate experiment: scale every group's LR by 0.5 or 2 (asks first)"),
    ("enter", "on an alert: its evidence, what it signals and the next experiments"),
    ("l  s", "loss chart: scale (auto, log, linear), smoothing of the train loss"),
    ("r", "next run (several runs connected)"),
    ("tab", "move between the layer table and the alerts"),
    ("q", "quit: the run goes on untouched"),
)


class HelpScreen(PanelScreen):
    """The keys of the monitor."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen > VerticalScroll {
        max-width: 100;
    }
    HelpScreen Static {
        margin-bottom: 0;
    }
    """

    def compose(self) -> ComposeResult:
        table = Table(title="traintop keys", box=None, show_header=False,
                      padding=(0, 2, 0, 0), title_justify="left")
        table.add_column("key", style="bold cyan")
        table.add_column("does")
        for key, does in KEYS:
            table.add_row(key, does)
        with VerticalScroll():
            yield Static(table, id="keys")
