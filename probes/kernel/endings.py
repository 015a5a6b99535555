"""How a run ended: one closed vocabulary for the bye's reason and the monitor's verdicts.

The probe says in its bye how the run ended (``bye_reason``): ``closed``, ``interrupted``,
``exit status N`` or ``error: TYPE: message``. Recorded run logs hold these strings, so
the wire keeps them. The monitor reads them back (``RunEnd.of``) and adds its own verdict
for a connection that ended without a bye: ``killed`` (the socket closed with no bye: the
process died without its exit handlers, by SIGKILL, a crash or ``os._exit``) or
``connection lost``. Each ending carries the words and the style it is shown in, so the
screen and headless mode say the same thing and no one parses what another formatted.

Stdlib only: both processes import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, unique

CLOSED = "closed"  # the bye of a run that ended cleanly
INTERRUPTED = "interrupted"  # ... by KeyboardInterrupt (Ctrl-C in the trainer)
ERROR_PREFIX = "error: "  # ... by an exception: "error: TYPE: message"
EXIT_PREFIX = "exit status "  # ... by sys.exit(N), N not 0
REASON_LIMIT = 300  # characters of a bye's reason (an error's message can be huge)

# What the monitor's server says of a connection that ended (``tui.server``).
CLOSED_BY_THE_RUN = "connection closed by the run"
CONNECTION_LOST = "connection lost"


@unique
class Ending(Enum):
    """How a run ended; each value carries its label (the words shown) and its style
    (a Rich style: the status line, the run list)."""

    FINISHED = ("finished", "green")
    INTERRUPTED = ("interrupted", "bold yellow")
    ERROR = ("error", "bold red")
    EXIT_STATUS = ("exit status", "bold red")
    KILLED = ("killed", "bold red")  # the monitor's: the socket closed with no bye
    CONNECTION_LOST = ("connection lost", "bold red")  # the monitor's: the socket failed
    DISCONNECTED = ("disconnected", "bold red")  # the monitor's: a log's end, its own close

    def __init__(self, label: str, style: str) -> None:
        self.label = label
        self.style = style

    @property
    def said_bye(self) -> bool:
        """True for the endings a probe reports in its bye."""
        return self in (Ending.FINISHED, Ending.INTERRUPTED, Ending.ERROR, Ending.EXIT_STATUS)


@dataclass(frozen=True)
class RunEnd:
    """An ending and what it says beside its label: the error's ``TYPE: message``, the
    exit status, or what happened to the connection."""

    ending: Ending
    detail: str = ""

    @property
    def label(self) -> str:
        """``finished``, ``error: RuntimeError: boom``, ``connection lost: reset``, ..."""
        word, detail = self.ending.label, self.detail
        if not detail:
            return word
        if self.ending is Ending.DISCONNECTED:
            return f"{word} ({detail})"
        if self.ending is Ending.EXIT_STATUS:
            return f"{word} {detail}"
        return f"{word}: {detail}"

    @property
    def style(self) -> str:
        return self.ending.style

    @classmethod
    def of(cls, bye: str | None, connection: str = "") -> RunEnd:
        """How a run ended: from its bye's reason if it said bye (None if not), else
        from what the monitor's server said of its connection."""
        return cls.from_bye(bye) if bye is not None else cls.from_connection(connection)

    @classmethod
    def from_bye(cls, reason: str) -> RunEnd:
        """The ending a bye's reason names (a reason of a newer probe: an error, as said)."""
        if reason in ("", CLOSED, "finished"):
            return cls(Ending.FINISHED)
        if reason == INTERRUPTED:
            return cls(Ending.INTERRUPTED)
        if reason.startswith(EXIT_PREFIX):
            return cls(Ending.EXIT_STATUS, reason[len(EXIT_PREFIX) :].strip())
        if reason.startswith(ERROR_PREFIX):
            return cls(Ending.ERROR, reason[len(ERROR_PREFIX) :].strip())
        return cls(Ending.ERROR, reason.strip())

    @classmethod
    def from_connection(cls, reason: str) -> RunEnd:
        """The monitor's verdict on a connection that ended with no bye."""
        if reason == CLOSED_BY_THE_RUN:
            return cls(Ending.KILLED)
        if reason.startswith(CONNECTION_LOST):
            return cls(Ending.CONNECTION_LOST, reason[len(CONNECTION_LOST) :].lstrip(": "))
        return cls(Ending.DISCONNECTED, reason)


def bye_reason(error: BaseException | None) -> str:
    """What a probe's bye says of how its run ended: ``closed``, ``interrupted``,
    ``exit status N`` or ``error: TYPE: message`` (at most ``REASON_LIMIT`` characters).

    Args:
        error: the exception that ended the run, None if none did.
    """
    if error is None:
        return CLOSED
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(error, SystemExit):  # sys.exit(): clean unless it carries a failure
        return CLOSED if error.code in (None, 0) else f"{EXIT_PREFIX}{error.code}"
    return f"{ERROR_PREFIX}{type(error).__name__}: {error}"[:REASON_LIMIT]
