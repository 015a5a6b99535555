"""A yes/no question before a command that changes the run."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class Confirm(ModalScreen[bool]):
    """Ask; y confirms, n or Escape declines."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    DEFAULT_CSS = """
    Confirm {
        align: center middle;
    }
    Confirm > Vertical {
        width: 64;
        max-width: 90%;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    """

    def __init__(self, question: str) -> None:  # plain text: it may name a run
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.question), id="question")
            yield Static("[b]y[/b] yes    [b]n[/b] no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
