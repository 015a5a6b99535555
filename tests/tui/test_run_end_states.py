"""How a run ended, said the same on the status line, in the run list, in toasts and
in headless lines: finished, interrupted, error: TYPE: message (cut to fit), exit
status N, killed (the connection closed with no bye), connection lost."""

from __future__ import annotations

import io
import shlex
from pathlib import Path
from typing import Any

import pytest

from probes.kernel.endings import Ending, RunEnd, bye_reason
from probes.kernel.wire import make_frame
from tests.frames import hello, short_run
from tests.waiting import settle
from tui.app import make_app
from tui.format import fit_status, run_ending
from tui.headless import HeadlessMonitor
from tui.server import Connection
from tui.widgets import RunList, StatusLine

ERROR = "error: RuntimeError: [/x.cc:1] boom"
# (the bye's reason, or None for no bye; what the server said of the connection;
#  the ending; the words shown)
STATES: dict[str, tuple[str | None, str, Ending, str]] = {
    "finished": ("closed", "connection closed by the run", Ending.FINISHED, "finished"),
    "interrupted": (
        "interrupted",
        "connection closed by the run",
        Ending.INTERRUPTED,
        "interrupted",
    ),
    "error": (ERROR, "connection closed by the run", Ending.ERROR, ERROR),
    "exit status": (
        "exit status 2",
        "connection closed by the run",
        Ending.EXIT_STATUS,
        "exit status 2",
    ),
    "killed": (None, "connection closed by the run", Ending.KILLED, "killed"),
    "connection lost": (
        None,
        "connection lost: [Errno 104] Connection reset by peer",
        Ending.CONNECTION_LOST,
        "connection lost: [Errno 104] Connection reset by peer",
    ),
}


class EndingSource:
    """A run's frames, then its connection closed as the server closes it; then idle."""

    description = "a run that ends"

    def __init__(self, frames: list[dict[str, Any]], reason: str) -> None:
        self.frames, self.reason = frames, reason

    async def run(self, monitor: Any) -> None:
        import asyncio

        conn = Connection(0, "test", None)
        for frame in self.frames:
            monitor.frame_received(conn, frame)
        monitor.connection_closed(conn, self.reason)
        await asyncio.Event().wait()


def frames_ending(bye: str | None, run: str = "run-a", name: str = "mlp") -> list[dict[str, Any]]:
    frames = short_run(12, run=run, name=name)
    if bye is not None:
        frames.append(make_frame("bye", run=run, reason=bye))
    return frames


@pytest.mark.parametrize("state", list(STATES))
async def test_the_status_line_and_the_run_list_say_how_the_run_ended(state: str) -> None:
    bye, connection, ending, words = STATES[state]
    # a second run, still connected, so that the run list shows beside the views
    other = short_run(3, run="run-b", name="other")
    app = make_app(EndingSource([*other, *frames_ending(bye)], connection))
    async with app.run_test(size=(160, 40)) as pilot:
        app.selected_run = "run-a"
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: words in status.text)
        run = app.state.runs["run-a"]
        assert run_ending(run) == RunEnd.of(bye, connection)
        fields, _ = fit_status(run, app.state, "", status.size.width)
        shown = [field for field in fields if field.startswith(words)]
        assert shown, fields
        assert all(getattr(field, "style", None) == ending.style for field in shown)  # its own
        run_list = app.query_one(RunList)
        assert run_list.has_class("-several")
        prompts = [str(run_list.get_option_at_index(i).prompt) for i in range(2)]
        assert any(p.startswith("○ mlp") and p.endswith(ending.label) for p in prompts), prompts
        toasts = [n.message for n in app._notifications]
        assert f"mlp: {words}" in toasts


async def test_a_long_error_is_cut_to_fit_80_columns_and_keeps_its_type() -> None:
    reason = "error: RuntimeError: [/__w/pytorch/gloo/transport/tcp/pair.cc:537] " + "x" * 200
    app = make_app(EndingSource(frames_ending(reason), "connection closed by the run"))
    async with app.run_test(size=(80, 24)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "error: RuntimeError: " in status.text)
        assert len(status.text) <= 78  # inside the padding: the line is whole
        field = next(f for f in status.text.split("│") if f.startswith("error:"))
        assert field.endswith("…")
        assert "alerts 0" in status.text and "drop 0" in status.text  # the rest still there


@pytest.mark.parametrize("state", list(STATES))
def test_headless_says_how_the_run_ended(state: str) -> None:
    bye, connection, _, words = STATES[state]
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9)
    conn = Connection(1, "test", None)
    for frame in frames_ending(bye):
        monitor.frame_received(conn, frame)
    monitor.connection_closed(conn, connection)
    line = out.getvalue().splitlines()[-1]
    said = f'"{words}"' if " " in words else words  # (a value with a space: quoted)
    assert line == f"disconnected run=mlp reason={said}"
    assert shlex.split(line) == ["disconnected", "run=mlp", f"reason={words}"]  # whole


@pytest.mark.parametrize(
    ("error", "ending"),
    [
        (None, Ending.FINISHED),
        (KeyboardInterrupt(), Ending.INTERRUPTED),
        (SystemExit(0), Ending.FINISHED),
        (SystemExit(3), Ending.EXIT_STATUS),
        (RuntimeError("[/x.cc:1] boom"), Ending.ERROR),
    ],
)
def test_what_the_probe_says_the_monitor_reads_back(
    error: BaseException | None, ending: Ending
) -> None:
    assert RunEnd.from_bye(bye_reason(error)).ending is ending


def test_every_ending_has_its_words_and_style() -> None:
    labels = [ending.label for ending in Ending]
    assert len(set(labels)) == len(labels)
    assert all(ending.style for ending in Ending)
    said = {ending for ending in Ending if ending.said_bye}
    assert said == {Ending.FINISHED, Ending.INTERRUPTED, Ending.ERROR, Ending.EXIT_STATUS}


def test_the_recorded_logs_byes_read_as_finished() -> None:
    import json

    data = Path(__file__).parent.parent / "data"
    reasons = [
        json.loads(line)["reason"]
        for path in sorted(data.glob("*.ndjson"))
        for line in path.read_text().splitlines()
        if '"kind":"bye"' in line
    ]
    assert reasons and all(RunEnd.from_bye(r).ending is Ending.FINISHED for r in reasons)


def test_a_reconnected_run_has_no_ending() -> None:
    from tui.state import MonitorState

    state = MonitorState()
    state.apply(1, hello())
    state.connection_closed(1, "connection closed by the run")
    assert state.runs["run-a"].ending == RunEnd(Ending.KILLED)
    state.apply(2, hello())
    assert state.runs["run-a"].ending is None and run_ending(state.runs["run-a"]) is None
