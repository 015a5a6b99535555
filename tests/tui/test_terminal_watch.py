"""The screen's output when its terminal hangs up (``tui.terminal``): writes are
dropped, never raised into Textual's writer thread, and the hang-up is noticed whether
or not anything was written since."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import signal
from collections.abc import Iterator

import pytest

from tui.app import TraintopApp
from tui.sources import FrameListSource
from tui.terminal import HangupSafeDriver, Leaving, TerminalWatch


@pytest.fixture
def terminal() -> Iterator[tuple[int, io.TextIOWrapper]]:
    """A pseudo-terminal: (its master side's fd, a text stream on its slave side)."""
    master, slave = pty.openpty()
    stream = io.TextIOWrapper(io.FileIO(slave, "w"), encoding="utf-8", write_through=True)
    yield master, stream
    with contextlib.suppress(OSError):  # (a test closed it: the hang-up)
        stream.close()
    with contextlib.suppress(OSError):
        os.close(master)


def test_a_live_terminal_is_written_to_and_not_gone(terminal) -> None:
    master, stream = terminal
    watch = TerminalWatch()
    out = watch.attach(stream)
    assert out.isatty() and out.fileno() == stream.fileno()
    out.write("hello")
    out.flush()
    assert os.read(master, 100) == b"hello"
    assert not watch.gone()


def test_writes_to_a_hung_up_terminal_are_dropped_and_say_it_is_gone(terminal) -> None:
    master, stream = terminal
    watch = TerminalWatch()
    out = watch.attach(stream)
    os.close(master)  # the other end hangs up (sshd, a tmux server)
    assert out.write("a frame") == len("a frame")  # no EIO raised
    out.flush()
    assert watch.gone()


def test_a_hang_up_is_found_with_nothing_written_since(terminal) -> None:
    master, stream = terminal
    watch = TerminalWatch()
    watch.attach(stream)
    assert not watch.gone()
    os.close(master)
    assert watch.gone()


def test_a_stream_that_is_no_terminal_is_never_gone(tmp_path) -> None:
    with open(tmp_path / "out.txt", "w") as stream:
        watch = TerminalWatch()
        watch.attach(stream)
        assert not watch.isatty() and not watch.gone()
    assert not TerminalWatch().gone()  # none attached (a headless app)


def test_the_app_drives_linux_terminals_through_its_watch() -> None:
    app = TraintopApp(FrameListSource([]))
    assert isinstance(app.terminal, TerminalWatch)
    if os.name == "posix":
        assert app.get_driver_class() is HangupSafeDriver


def test_leaving_on_a_hung_up_terminal_is_leaving_on_sighup(terminal) -> None:
    master, stream = terminal
    watch = TerminalWatch()
    watch.attach(stream)
    codes: list[int] = []
    leaving = Leaving(watch, codes.append)
    leaving.check_terminal()
    assert codes == []  # a live terminal: nothing
    os.close(master)
    leaving.check_terminal()
    assert codes == [128 + signal.SIGHUP]
