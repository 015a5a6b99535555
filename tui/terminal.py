"""The screen's terminal, and knowing when it is gone.

An SSH session that drops hangs up the monitor's terminal. Textual's Linux driver
writes through one thread and a bounded queue; its first write to the hung-up terminal
raises ``EIO`` in that thread, which ends it, and the next writes fill the queue and
block the event loop for good, the shutdown's own writes included: a monitor left
spinning on a dead terminal, holding its socket, its demo trainer never stopped. A
shell's SIGHUP does not always come either (a non-interactive shell, ``bash -c``,
forwards none to its child).

The app owns a ``TerminalWatch``; its driver (``HangupSafeDriver``, Textual's own
otherwise) writes through it. The watch swallows the errors of a hung-up terminal and
notes them. ``Leaving`` is the one owner of what ends the screen from outside: it
installs the exit signals' handlers and removes them, and asks the watch once a second
(``gone``), leaving as SIGHUP would have it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import termios
import threading
from collections.abc import Callable
from typing import IO, Any, cast

from textual.drivers.linux_driver import LinuxDriver


class TerminalWatch:
    """The screen's output: written to its terminal until that fails, then dropped.
    It never raises into Textual's writer thread."""

    def __init__(self) -> None:
        self._stream: IO[str] | None = None
        self._fd: int | None = None  # the terminal's, when it was one
        self._gone = threading.Event()

    def attach(self, stream: IO[str]) -> TerminalWatch:
        """Write to ``stream`` (the driver's output) from now on; returns the stream
        the driver writes to instead."""
        self._stream = stream
        try:
            fd = stream.fileno()
            self._fd = fd if os.isatty(fd) else None
        except (OSError, ValueError):
            self._fd = None
        return self

    def gone(self) -> bool:
        """Has the terminal hung up? A write failed, or it no longer answers a request
        for its attributes (``EIO`` once hung up). Never, for a stream not a terminal
        or none at all (tests' headless driver)."""
        if not self._gone.is_set() and self._fd is not None:
            try:
                termios.tcgetattr(self._fd)
            except (OSError, termios.error):
                self._gone.set()
        return self._gone.is_set()

    # --- the stream Textual's writer thread writes to ------------------------------------

    def write(self, text: str) -> int:
        if self._stream is not None and not self._gone.is_set():
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # EIO: hung up; ValueError: closed
                self._gone.set()
        return len(text)

    def flush(self) -> None:
        if self._stream is not None and not self._gone.is_set():
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._gone.set()

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError("no terminal attached")
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._fd is not None


class HangupSafeDriver(LinuxDriver):
    """Textual's Linux driver, writing through its app's ``TerminalWatch`` (an app
    with a ``terminal`` attribute; any other is driven as Textual's driver does)."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(app, *args, **kwargs)
        watch = getattr(app, "terminal", None)
        stream = getattr(self, "_file", None)  # (the driver's output: stderr)
        if isinstance(watch, TerminalWatch) and stream is not None:
            # (a text stream in all Textual reads of it: write, flush, fileno)
            self._file = cast(Any, watch.attach(stream))


#: Signals that end the monitor the way q does, so the terminal is given back as it was
#: (no alternate screen, no mouse tracking) and a demo's trainer and folder are cleaned.
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Leaving:
    """What ends the screen from outside: the exit signals and a terminal that hung up,
    each ending it through ``exit`` with ``128 + signal`` (a hang-up as SIGHUP).

    Args:
        watch: the app's terminal.
        exit: ends the app with a return code (as ``q`` does).
    """

    def __init__(self, watch: TerminalWatch, exit: Callable[[int], None]) -> None:
        self._watch = watch
        self._exit = exit

    def install(self) -> None:
        """The signals' handlers, on the running loop (not possible off the main
        thread: tests' pilots run there)."""
        loop = asyncio.get_running_loop()
        for signum in EXIT_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._exit, 128 + signum)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in EXIT_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)

    def check_terminal(self) -> None:
        """The terminal hung up (an SSH session dropped, its window closed) and no
        SIGHUP came: leave as one would have it (the app calls this once a second)."""
        if self._watch.gone():
            self._exit(128 + signal.SIGHUP)
