"""Two runs: runs of one name told apart (in the run list and in headless lines), and a
new run taking over the view from an ended one, never from a live one."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

from probes.kernel.wire import make_frame
from tests.frames import short_run
from tests.waiting import settle
from tui.app import make_app
from tui.headless import HeadlessMonitor
from tui.server import Connection
from tui.state import MonitorState
from tui.widgets import RunList, StatusLine

STARTED = 1_760_000_000.0  # a wall time; shown as the local HH:MM:SS


def clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def run_frames(run: str, name: str, steps: int = 5, **hello: Any) -> list[dict[str, Any]]:
    frames = short_run(steps, run=run, name=name)
    frames[0] = {**frames[0], **hello}
    return frames


def ended(run: str) -> list[dict[str, Any] | None]:
    """A bye, then the connection closed (None)."""
    return [make_frame("bye", run=run, reason="closed"), None]


class ScriptSource:
    """Frames, each on its run's connection, and connections closed (None), in order;
    the second part only once ``go_on`` is set; then idle, as a live socket."""

    description = "a script of runs"

    def __init__(self, first: list[tuple[int, Any]], then: list[tuple[int, Any]] = ()) -> None:
        self.first, self.then = first, list(then)
        self.go_on = asyncio.Event()
        self.conns: dict[int, Connection] = {}

    async def run(self, monitor: Any) -> None:
        await self._feed(monitor, self.first)
        await self.go_on.wait()
        await self._feed(monitor, self.then)
        await asyncio.Event().wait()

    async def _feed(self, monitor: Any, script: list[tuple[int, Any]]) -> None:
        for conn_id, frame in script:
            conn = self.conns.setdefault(conn_id, Connection(conn_id, f"c{conn_id}", None))
            if frame is None:
                monitor.connection_closed(conn, "connection closed by the run")
            else:
                monitor.frame_received(conn, frame)
            await asyncio.sleep(0)


def on(conn_id: int, frames: list[Any]) -> list[tuple[int, Any]]:
    return [(conn_id, frame) for frame in frames]


def quiet(app: Any) -> Any:
    app.notify = lambda *args, **kwargs: None  # (toasts are not what is tested here)
    return app


async def test_a_new_run_takes_over_the_view_from_one_that_has_ended() -> None:
    source = ScriptSource(
        on(0, [*run_frames("run-a", "first"), *ended("run-a")])
        + on(1, run_frames("run-b", "second", steps=8))
    )
    source.go_on.set()
    app = quiet(make_app(source))
    async with app.run_test(size=(120, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "run-b" in app.state.runs)
        assert app.selected_run == "run-b"  # at its hello: no r pressed
        await settle(pilot, lambda: status.text.startswith("second") and "step 7" in status.text)


async def test_a_new_run_never_takes_over_from_a_live_one() -> None:
    source = ScriptSource(
        on(0, run_frames("run-a", "first")) + on(1, run_frames("run-b", "second")),
        then=on(0, ended("run-a")) + on(2, run_frames("run-c", "third")),
    )
    app = quiet(make_app(source))
    async with app.run_test(size=(120, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "run-b" in app.state.runs and "2 runs" in status.text)
        assert app.selected_run == "run-a"  # live: the second run did not take it
        await pilot.press("r")
        await settle(pilot, lambda: status.text.startswith("second"))
        source.go_on.set()  # the first run ends; a third connects: the second is live
        await settle(pilot, lambda: "run-c" in app.state.runs)
        await settle(pilot, lambda: not app.state.runs["run-a"].connected)
        assert app.selected_run == "run-b"
        assert status.text.startswith("second")


def prompts(app: Any) -> list[str]:
    run_list = app.query_one(RunList)
    return [str(run_list.get_option_at_index(i).prompt) for i in range(run_list.option_count)]


async def test_runs_of_one_name_are_told_apart_in_the_run_list() -> None:
    source = ScriptSource(
        on(0, run_frames("run-a", "mlp", started=STARTED, pid=11))
        + on(1, run_frames("run-b", "mlp", started=STARTED + 65, pid=12))
        + on(2, run_frames("run-c", "mlp", started=STARTED + 65, pid=13))  # the same second
        + on(3, run_frames("run-d", "other", started=STARTED))
    )
    source.go_on.set()
    app = quiet(make_app(source))
    async with app.run_test(size=(120, 40)) as pilot:
        run_list = app.query_one(RunList)
        await settle(pilot, lambda: run_list.option_count == 4)
        shown = prompts(app)
        assert len(set(shown)) == 4, shown
        assert shown[0].splitlines()[1].strip() == clock(STARTED)  # when it started
        assert shown[1].splitlines()[1].strip() == "box:12"  # (its second is another's)
        assert shown[2].splitlines()[1].strip() == "box:13"
        assert shown[3].splitlines() == [shown[3]]  # a name of its own: no mark


def test_runs_of_one_name_are_told_apart_by_the_state() -> None:
    state = MonitorState()
    for conn_id, frame in on(0, run_frames("a", "mlp", started=STARTED)) + on(
        1, run_frames("b", "mlp", started=STARTED + 1)
    ):
        state.apply(conn_id, frame)
    assert state.told_apart(state.runs["a"]) == clock(STARTED)
    assert state.told_apart(state.runs["b"]) == clock(STARTED + 1)
    state.apply(2, run_frames("c", "solo")[0])
    assert state.told_apart(state.runs["c"]) is None
    state.apply(3, {**run_frames("d", "mlp")[0], "started": "noon", "pid": 5})  # no time
    assert state.told_apart(state.runs["d"]) == "box:5"  # ... where it runs
    state.apply(4, {**run_frames("e", "mlp")[0], "pid": 5})  # ... nor a place of its own
    assert state.told_apart(state.runs["e"]) == "e"  # its run id
    assert state.told_apart(state.runs["a"]) == clock(STARTED)


def test_headless_lines_tell_runs_of_one_name_apart() -> None:
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9)
    conns = [Connection(i, f"c{i}", None) for i in range(3)]
    script = (
        on(0, run_frames("run-a", "mlp", started=STARTED))
        + on(1, run_frames("run-b", "mlp", started=STARTED + 1))
        + on(2, run_frames("run-c", "mlp", started=STARTED + 1, host="gpu7", pid=99))
        + on(0, ended("run-a"))
        + on(1, ended("run-b"))
    )
    for conn_id, frame in script:
        if frame is None:
            monitor.connection_closed(conns[conn_id], "connection closed by the run")
        else:
            monitor.frame_received(conns[conn_id], frame)
    lines = out.getvalue().splitlines()
    later = clock(STARTED + 1)
    assert [line.split()[1] for line in lines if line.startswith("connected ")] == [
        "run=mlp",  # the first keeps its name: one word, one run, all along the log
        f"run=mlp@{later}",
        "run=mlp@gpu7:99",  # (it started in the same second as the second)
    ]
    assert f"disconnected run=mlp@{later} reason=finished" in lines
    assert "disconnected run=mlp reason=finished" in lines
