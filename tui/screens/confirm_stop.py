"""``X`` under ``traintop run``: stop the script, asked first.

A yes sends one signal: SIGINT, as Ctrl-C would; once that was sent and the script
still runs, the question is SIGTERM's. Never more without asking again.
"""

from __future__ import annotations

import signal
from typing import Any, Protocol

from textual.app import App

from tui.screens.confirm import Confirm


class StoppableScript(Protocol):
    """The script ``traintop run`` started (``tui.runner.Script``)."""

    def ended(self) -> str | None:
        """A line saying that it has ended, or None while it runs."""

    def stop_question(self) -> tuple[str, signal.Signals]:
        """The question, and the signal a yes sends."""

    def stop(self, signum: int) -> str:
        """Send ``signum`` once; a line saying what was done."""


class ConfirmStop(Confirm):
    """Ask before stopping the script; a yes is for ``signum``, the signal asked about."""

    DEFAULT_CSS = """
    ConfirmStop > Vertical {
        border: thick $error;
    }
    """

    def __init__(self, script: StoppableScript) -> None:
        question, self.signum = script.stop_question()
        super().__init__(question)


def ask_to_stop(app: App[Any], script: StoppableScript) -> None:
    """``X``: the question, then the one signal a yes sends (or say it has ended)."""
    ended = script.ended()
    if ended is not None:
        app.notify(ended, timeout=4)
        return
    asking = ConfirmStop(script)

    def answered(yes: bool | None) -> None:
        if yes:
            app.notify(script.stop(asking.signum), timeout=4)

    app.push_screen(asking, answered)
