"""Frames that decode but carry what no probe sends: each is rejected with one line,
and the run goes on (its later frames, its bye) untouched."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from probes.kernel.wire import Address, FrameError, decode_frame, encode_frame, make_frame
from tests.frames import hello, step
from tests.tui.test_server import exchange, started
from tests.waiting import until
from tui.events import FrameRejected
from tui.headless import HeadlessMonitor
from tui.server import Connection

CONN = Connection(1, "test", None)

BAD_FRAMES: dict[str, dict[str, Any]] = {
    "infinite step": {**step(5), "step": float("inf")},
    "string step": {**step(5), "step": "5"},
    "string loss": {**step(5), "scalars": {"loss": "low"}},
    "scalars as a list": {**step(5), "scalars": [1, 2]},
    "grad norms as a string": {**step(5), "grad_norms": "abc"},
    "none_grad_params of infinities": {**step(5), "none_grad_params": [float("inf")]},
    "not_stepped as a number": {**step(5), "not_stepped": 3},
    "a span of strings": {**step(5), "span": ["a", "b"]},
    "peaks as a string": {**step(5), "grad_norms_max": "abc"},
    "a string in scalars_max": {**step(5), "scalars_max": {"loss": "high"}},
    "a string first non-finite step": {**step(5), "first_non_finite_step": "7"},
    "event with a string step": make_frame("event", run="run-a", name="lr_scale", step="abc"),
    "anomaly naming no module": make_frame("anomaly", run="run-a", step=3, first_non_finite="oops"),
    "anomaly with a string time": make_frame("anomaly", run="run-a", step=3, time="abc"),
    "alert at an infinite step": make_frame(
        "alert", run="run-a", alert={"kind": "x", "step": float("inf")}
    ),
    "eval with infinite forwards": make_frame("eval", run="run-a", step=3, forwards=float("inf")),
    "a command, from a probe": make_frame("command", run="run-a", id=1, command="pause"),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_a_bad_frame_is_rejected_with_one_line_and_the_run_goes_on(name: str) -> None:
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9)
    for frame in (hello(), step(0), step(1)):
        monitor.frame_received(CONN, frame)
    monitor.frame_received(CONN, BAD_FRAMES[name])
    monitor.frame_received(CONN, step(2))
    monitor.frame_received(CONN, make_frame("bye", run="run-a", reason="finished"))
    monitor.connection_closed(CONN, "connection closed by the run")
    rejected = [line for line in out.getvalue().splitlines() if line.startswith("rejected")]
    assert len(rejected) == 1, out.getvalue()
    run = monitor.state.runs["run-a"]
    assert run.last_step == 2
    assert (run.connected, run.disconnect_reason) == (False, "finished")


@pytest.mark.parametrize(
    "hello_frame",
    [
        {**hello(), "layers": ["a", "a", "b"]},
        {**hello(), "activations": [["act", "relu", "x"]]},
        {**hello(), "layers": "abc"},
    ],
)
def test_a_bad_hello_is_rejected(hello_frame: dict[str, Any]) -> None:
    monitor = HeadlessMonitor(out=io.StringIO())
    events: list[object] = []
    monitor.monitor.on_events = events.extend  # (headless composes the monitor)
    monitor.frame_received(CONN, hello_frame)
    assert [type(e) for e in events] == [FrameRejected]
    assert monitor.state.runs == {}


def test_a_step_that_goes_back_is_dropped_with_a_line() -> None:
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9)
    for frame in (hello(), step(0), step(5), step(3, seq=10)):  # fresh, not a replay
        monitor.frame_received(CONN, frame)
    assert "step 3 is not after step 5: dropped" in out.getvalue()
    assert monitor.state.runs["run-a"].last_step == 5


def test_an_integer_too_large_for_a_float_is_an_infinite_loss() -> None:
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9)
    for frame in (hello(), step(0), {**step(1), "scalars": {"loss": 10**400}}, step(2)):
        monitor.frame_received(CONN, frame)
    assert "ALERT error non_finite step=1 subject=loss value=inf" in out.getvalue()
    assert monitor.state.runs["run-a"].last_step == 2


def test_an_integer_too_large_for_json_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="malformed"):
        decode_frame(b'{"v": 1, "kind": "step", "step": ' + b"9" * 5000 + b"}")


async def test_a_failing_sink_never_leaves_a_ghost_run(socket_path: str) -> None:
    """Whatever goes wrong inside the monitor, a connection that ends closes its run."""
    server, monitor = await started(Address("unix", path=socket_path))
    calls = 0
    original = monitor.frame_received

    def flaky(conn: Connection, frame: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        original(conn, frame)
        if calls == 2:
            raise RuntimeError("a bug in a listener")

    monitor.frame_received = flaky  # type: ignore[method-assign]
    try:
        await exchange(
            server.address, [encode_frame(hello()), encode_frame(step(0))], until_closed=True
        )
        await until(
            lambda: "run-a" in monitor.state.runs and not monitor.state.runs["run-a"].connected
        )
        assert "monitor error: RuntimeError" in monitor.state.runs["run-a"].disconnect_reason
    finally:
        await server.close()


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


async def test_headless_stops_when_its_reader_goes_away() -> None:
    """``traintop --headless | head``: once the pipe closes, the monitor stops."""
    monitor = HeadlessMonitor(out=ClosedPipe())
    monitor.frame_received(CONN, hello())
    await asyncio.wait_for(monitor.output_closed.wait(), 1.0)


def test_losses_near_float_max_do_not_overflow_the_rules() -> None:
    """The flat-loss rule averages losses; 1.5e308 twice overflowed a plain sum."""
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9)
    monitor.frame_received(CONN, hello())
    for n in range(260):
        monitor.frame_received(CONN, step(n, loss=1.5e308))
    assert "rejected" not in out.getvalue()
    assert monitor.state.runs["run-a"].last_step == 259


class Writer:
    """Stands in for an asyncio writer: keeps what the monitor sends to the probe."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return False


def headless_with_writer() -> tuple[HeadlessMonitor, Connection, Writer, io.StringIO]:
    writer = Writer()
    out = io.StringIO()
    return (
        HeadlessMonitor(out=out, summary_every=10**9),
        Connection(2, "test", writer),
        writer,
        out,
    )  # type: ignore[arg-type]


def resumes(writer: Writer) -> int:
    return sum(1 for line in writer.sent if b'"command"' in line and b'"resume"' in line)


def paused_event(replayed: bool) -> dict[str, Any]:
    frame = make_frame(
        "event",
        run="run-a",
        name="paused",
        step=1,
        reason="the guard",
        state={"paused": True},
        seq=1,
    )
    return {**frame, "replayed": True} if replayed else frame


def test_headless_resumes_a_pause_as_it_happens() -> None:
    monitor, conn, writer, out = headless_with_writer()
    for frame in (hello(), step(0), step(1), paused_event(replayed=False)):
        monitor.frame_received(conn, frame)
    assert resumes(writer) == 1
    assert 'PAUSED step=1 reason="the guard" - resuming (headless)' in out.getvalue()


@pytest.mark.parametrize("paused_now", [True, False])
def test_a_late_headless_monitor_resumes_only_a_run_paused_now(paused_now: bool) -> None:
    """An old pause in the history is printed as history; whether the run is paused now
    is what its hello says."""
    monitor, conn, writer, out = headless_with_writer()
    greeting = {**hello(), "state": {"paused": paused_now, "anomaly_armed": 0, "guard": False}}
    for frame in (
        greeting,
        {**step(0), "replayed": True},
        {**step(1), "replayed": True},
        paused_event(replayed=True),
    ):
        monitor.frame_received(conn, frame)
    assert "(history) PAUSED step=1" in out.getvalue()
    assert resumes(writer) == (1 if paused_now else 0)
