"""The checks view: reports of check_split, check_preprocessing, check_batch and
overfit_batch that the training process sent."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from probes.kernel.wire import Frame
from tui.screens.panel import PanelScreen
from tui.text import plain_block, plain_name


class ChecksScreen(PanelScreen):
    """Every check report of the run, newest last; Escape closes."""

    BINDINGS = [Binding("escape,q,c", "dismiss", "Close")]
    DEFAULT_CSS = """
    ChecksScreen > VerticalScroll {
        width: 95%;
        max-width: 130;
        height: 90%;
    }
    """

    def __init__(self, reports: list[Frame]) -> None:
        super().__init__()
        self.reports = reports

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            if not self.reports:
                yield Static(
                    Text(
                        "No checks yet. Run probes.check_split, check_batch, "
                        "check_preprocessing or overfit_batch with probe=... to "
                        "see them here.",
                        style="dim",
                    ),
                    id="empty",
                )
            for index, report in enumerate(self.reports):
                style = "green" if report.get("ok") else "bold red"
                title = Text(f"{plain_name(report.get('check'))}  ", style="bold")
                title.append("ok" if report.get("ok") else "findings", style=style)
                title.append(f"  (step {plain_name(report.get('step'))})", style="dim")
                body = plain_block(report.get("text", ""))  # the training process's words
                yield Static(Text.assemble(title, "\n", body), id=f"check-{index}")
