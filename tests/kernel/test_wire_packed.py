"""The packed form of a step's float32 lists: read both ways, said before it is sent.

A probe packs its norms (base64 float32) only for a monitor whose ``welcome`` said it
reads them; an older monitor (no such welcome) gets plain lists, an older probe (plain
lists, the welcome ignored) is read as ever, a run log holds plain lists, and a bad
packed list is one frame's one-line error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import socket
import threading
import time
from array import array
from asyncio import selector_events

import pytest

from probes.kernel.schema.spec import FLOAT32_FIELDS
from probes.kernel.wire import (
    PACKED_FLOAT32,
    Address,
    FrameError,
    FrameReader,
    decode_frame,
    encode_frame,
    make_frame,
    pack_float32,
    unpack_float32,
)
from probes.runtime.link.sender import Sender, _wire_float
from tests.frames import hello, step
from tests.waiting import until, wait_until
from tui.monitor import Monitor
from tui.runlog import read_run_log
from tui.server import Connection, MonitorServer

FLOAT32S = [float(array("f", [v])[0]) for v in (0.1, 1.5e-8, 3.0e38, 123.456, -2.5, 0.0)]


def packed_step(index: int, grads: list[float], **fields: object) -> dict:
    frame = step(index, grad_norms=grads)
    frame["grad_norms"] = pack_float32(grads)
    frame.update(fields)
    return frame


# --- the form itself ---------------------------------------------------------------------


def test_packed_values_read_back_as_the_plain_form_reads_them() -> None:
    text = pack_float32(FLOAT32S)
    assert text is not None and len(text) == math.ceil(4 * len(FLOAT32S) / 3) * 4
    assert unpack_float32("grad_norms", text) == FLOAT32S
    # the plain form's 9 digits name the same float32 (the packed form reads it exactly)
    assert list(array("f", [_wire_float(v) for v in FLOAT32S])) == FLOAT32S
    assert base64.b64decode(text) == array("f", FLOAT32S).tobytes()  # little-endian here


def test_non_finite_values_travel_as_they_are() -> None:
    values = [math.nan, math.inf, -math.inf, 1.0]
    text = pack_float32(values)
    assert text is not None
    back = unpack_float32("grad_norms", text)
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf, 1.0]


def test_what_the_packed_form_cannot_carry_exactly_stays_a_list() -> None:
    assert pack_float32([1.0, None, 2.0]) is None  # a layer without a gradient
    assert pack_float32([1.0, 2]) is None  # not a float
    assert pack_float32([1.0, 1e39]) is None  # finite, but Inf as a float32
    assert pack_float32([]) is None
    assert pack_float32([1e39, math.inf]) is None  # (the Inf does not hide the overflow)


def test_a_step_frame_with_packed_lists_decodes_to_plain_ones() -> None:
    frame = packed_step(3, FLOAT32S[:3], param_norms=pack_float32([5.0, 6.0, 7.0]))
    decoded = decode_frame(encode_frame(frame))
    assert decoded["grad_norms"] == FLOAT32S[:3]
    assert decoded["param_norms"] == [5.0, 6.0, 7.0]
    assert "grad_norms" in FLOAT32_FIELDS and "param_norms" in FLOAT32_FIELDS
    # only a step's float32 fields are read as packed: another string stays a string
    event = decode_frame(encode_frame(make_frame("event", name="x", grad_norms="AAAAAA==")))
    assert event["grad_norms"] == "AAAAAA=="


@pytest.mark.parametrize(
    "text",
    [
        "AAAAAAA=",  # 5 bytes: not whole float32 values
        "AAA=",  # 2 bytes
        "AA!AAAAA",  # a character outside base64
        "AAAAA",  # bad padding
        "AAAAAA\u00e9=",  # not ASCII
    ],
)
def test_a_bad_packed_list_is_a_one_line_error_for_its_frame(text: str) -> None:
    bad = encode_frame({**step(1), "grad_norms": text})
    items = FrameReader().feed(encode_frame(step(0)) + bad + encode_frame(step(2)))
    assert [type(i) for i in items] == [dict, FrameError, dict]  # nothing else lost
    message = str(items[1])
    assert "grad_norms is not packed float32" in message and "\n" not in message
    assert [i["step"] for i in items if isinstance(i, dict)] == [0, 2]


def _fed(frames: list[dict], *, packed: bool) -> Monitor:
    """A monitor fed ``frames`` through a frame reader, their norms packed or plain."""
    monitor = Monitor()
    conn = Connection(1, "local", None)
    reader = FrameReader()
    for frame in frames:
        frame = dict(frame)
        for name in FLOAT32_FIELDS:
            if packed and frame.get(name):
                frame[name] = pack_float32(frame[name]) or frame[name]
        for item in reader.feed(encode_frame(frame)):
            assert not isinstance(item, FrameError), item
            monitor.frame_received(conn, item)
    return monitor


def test_the_monitor_keeps_the_same_run_from_either_form() -> None:
    """Read packed, a record's lists skip their readers' scans and conversions (the
    heatmap, the sparklines keep its float32 array): what the run holds is the same."""
    layers = ["a", "b", "c"]
    frames: list[dict] = [hello(layers=layers)]
    for index in range(40):
        grads = [float(array("f", [0.5 + 0.01 * index + i])[0]) for i in range(3)]
        if index == 30:
            grads[1] = math.nan  # a non-finite step: the heatmap's slow path
        frame = step(index, grad_norms=grads)
        if index % 10 == 0:
            frame["param_norms"] = [5.0, 6.0, 7.0]
        frames.append(frame)
    plain = _fed(frames, packed=False).state.runs["run-a"]
    packed = _fed(frames, packed=True).state.runs["run-a"]
    assert packed.step_records == plain.step_records == 40
    assert repr(packed.grad_norms) == repr(plain.grad_norms)
    assert packed.param_norms == plain.param_norms == [5.0, 6.0, 7.0]
    for layer in range(3):
        assert repr(packed.grad_history(layer)) == repr(plain.grad_history(layer))
        assert packed.heatmap.row(layer) == plain.heatmap.row(layer)
    assert packed.heatmap.row(1)[30] == math.inf  # NaN kept as the heatmap's non-finite
    assert [e.alert.key for e in packed.alerts] == [e.alert.key for e in plain.alerts]
    assert any(e.alert.kind == "non_finite" for e in packed.alerts)
    # the sparkline keeps the packed float32 array itself: 4 bytes a value
    kept = [norms for norms in packed.grad_records if isinstance(norms, array)]
    assert kept and {norms.typecode for norms in kept} == {"f"}


# --- the monitor says it reads the packed form, and reads both -----------------------


async def _talk(path: str, frames: list[bytes]) -> list[dict]:
    """Send raw lines as a probe; what the monitor sent back within a moment."""
    reader, writer = await asyncio.open_unix_connection(path)
    for data in frames:
        writer.write(data)
    await writer.drain()
    got = b""
    with contextlib.suppress(TimeoutError):
        while b"\n" not in got:
            got += await asyncio.wait_for(reader.read(65536), 2)
    await asyncio.sleep(0.2)
    writer.close()
    return [json.loads(line) for line in got.splitlines() if line.strip()]


async def test_the_monitor_welcomes_a_hello_with_what_it_reads(socket_path: str) -> None:
    monitor = Monitor()
    server = MonitorServer(Address("unix", path=socket_path), monitor)
    await server.start()
    try:
        grads = FLOAT32S[:3]
        frames = [hello(), step(0), packed_step(1, grads), {**step(2), "grad_norms": "AA=A"}]
        frames.append(packed_step(3, grads))
        replies = await _talk(socket_path, [encode_frame(f) for f in frames])
        assert replies[0]["kind"] == "welcome" and PACKED_FLOAT32 in replies[0]["reads"]
        run = monitor.state.runs["run-a"]
        await until(lambda: run.last_step == 3)
        assert run.step_records == 3  # the bad one rejected, the one after it taken
        assert run.grad_norms == grads
        assert monitor.state.rejected_frames == 1
        assert "grad_norms" in monitor.state.last_rejection
    finally:
        await server.close()


async def test_a_run_gone_before_its_hello_is_read_loses_no_frame(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short run (or a rank of a job starting on a busy monitor) may write its last
    frame and close before the monitor reads its hello: the welcome finds it gone, and
    what it wrote is read all the same (a failed write through asyncio's transport
    closed the connection, and its frames still to be read were lost)."""
    # small reads, as on a busy monitor: most of what the run wrote is still to be read
    # when its hello is (its frames here fit the socket's buffer, and one read of 256 KiB)
    monkeypatch.setattr(selector_events._SelectorTransport, "max_size", 4096)
    monitor = Monitor()
    server = MonitorServer(Address("unix", path=socket_path), monitor)
    await server.start()
    try:
        # written and closed without letting the monitor's loop run in between
        frames = [hello(), *(step(i) for i in range(50)), make_frame("bye", reason="closed")]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(socket_path)
            sock.sendall(b"".join(encode_frame(f) for f in frames))
        await until(lambda: "run-a" in monitor.state.runs)
        run = monitor.state.runs["run-a"]
        await until(lambda: not run.connected)
        assert run.step_records == 50 and run.ended and run.end_reason == "closed"
    finally:
        await server.close()


async def test_an_older_probe_plain_lists_and_no_reading_is_served_as_ever(
    socket_path: str,
) -> None:
    monitor = Monitor()
    server = MonitorServer(Address("unix", path=socket_path), monitor)
    await server.start()
    try:
        # an older probe writes everything at once and never reads what comes back
        _, writer = await asyncio.open_unix_connection(socket_path)
        writer.write(b"".join(encode_frame(f) for f in [hello(), step(0), step(1)]))
        await writer.drain()
        await until(lambda: "run-a" in monitor.state.runs)
        run = monitor.state.runs["run-a"]
        await until(lambda: run.last_step == 1)
        assert run.grad_norms == step(1)["grad_norms"]
        writer.close()
    finally:
        await server.close()


async def test_a_recorded_packed_stream_is_a_plain_run_log_that_replays(
    socket_path: str, tmp_path: object
) -> None:
    log = f"{tmp_path}/run.ndjson"
    monitor = Monitor(record_path=log)
    server = MonitorServer(Address("unix", path=socket_path), monitor)
    await server.start()
    try:
        await _talk(socket_path, [encode_frame(hello()), encode_frame(packed_step(0, FLOAT32S))])
        await until(lambda: monitor.state.runs["run-a"].last_step == 0)
    finally:
        await server.close()
        monitor.close()
    with open(log) as handle:
        lines = [json.loads(line) for line in handle]
    assert lines[1]["grad_norms"] == FLOAT32S  # a list in the log, readable by any version
    frames = list(read_run_log(log))
    assert [f["kind"] for f in frames if isinstance(f, dict)] == ["hello", "step"]


# --- the probe packs only for a monitor that said it reads the form --------------------


class RawMonitor:
    """A stand-in monitor that keeps the raw lines a probe sends; ``welcomes``: it
    answers the hello as a monitor that reads packed lists does (else: one from before)."""

    def __init__(self, path: str, *, welcomes: bool, leave_when_packed: bool = False) -> None:
        self.lines: list[dict] = []
        self.connected = False
        self._welcomes = welcomes
        self._leave = leave_when_packed
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        self.connected = True
        conn.settimeout(10)
        buffer = b""
        with conn:
            while data := conn.recv(65536):
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    frame = json.loads(line)
                    self.lines.append(frame)
                    if frame["kind"] == "hello" and self._welcomes:
                        reads = [PACKED_FLOAT32]
                        conn.sendall(encode_frame(make_frame("welcome", reads=reads)))
                    if frame["kind"] == "bye":
                        return
                    if self._leave and isinstance(frame.get("grad_norms"), str):
                        return

    def close(self) -> None:
        self._thread.join(10)
        self._server.close()


def _send_steps(path: str, count: int) -> Sender:
    sender = Sender(Address("unix", path=path), hello={"run": "x"}, flush_interval=0.02)
    assert sender.connected.wait(5), "the sender did not connect"
    grads = [0.1, math.nan, 0.3]
    for index in range(count):
        sender.put({"kind": "step", "step": index, "time": time.time(), "grad_norms": grads})
        time.sleep(0.03)
    sender.put({"kind": "step", "step": count, "time": time.time(), "grad_norms": [0.1, None]})
    sender.close()
    return sender


def test_a_probe_packs_once_the_monitor_said_it_reads_the_form(socket_path: str) -> None:
    monitor = RawMonitor(socket_path, welcomes=True)
    _send_steps(socket_path, 20)
    monitor.close()
    steps = [f for f in monitor.lines if f["kind"] == "step"]
    assert len(steps) == 21
    packed = [f for f in steps if isinstance(f["grad_norms"], str)]
    assert packed, "no step was packed after the welcome"
    first = steps.index(packed[0])
    # plain until the welcome was read, packed from then on; a list with a None plain
    assert all(isinstance(f["grad_norms"], str) for f in steps[first:-1])
    assert steps[-1]["grad_norms"] == [0.1, None]
    back = unpack_float32("grad_norms", packed[0]["grad_norms"])
    assert back[0] == float(array("f", [0.1])[0]) and math.isnan(back[1])


def test_a_probe_sends_plain_lists_to_a_monitor_from_before(socket_path: str) -> None:
    monitor = RawMonitor(socket_path, welcomes=False)
    _send_steps(socket_path, 10)
    monitor.close()
    steps = [f for f in monitor.lines if f["kind"] == "step"]
    assert len(steps) == 11
    assert all(isinstance(f["grad_norms"], list) for f in steps)


def test_the_probe_history_stays_plain_for_the_next_monitor(socket_path: str) -> None:
    """Packed frames are the connection's: the history replayed to a later monitor (one
    from before, say) holds plain lists."""
    first = RawMonitor(socket_path, welcomes=True, leave_when_packed=True)
    sender = Sender(Address("unix", path=socket_path), hello={"run": "x"}, flush_interval=0.02)
    try:
        assert sender.connected.wait(5)
        for index in range(20):
            sender.put({"kind": "step", "step": index, "time": 1.0, "grad_norms": [0.5, 0.25]})
            time.sleep(0.03)
        first.close()  # it left after its first packed step
        assert any(isinstance(f.get("grad_norms"), str) for f in first.lines)
        os.unlink(socket_path)
        second = RawMonitor(socket_path, welcomes=False)
        wait_until(lambda: second.connected, "the sender to reach the second monitor", 10)
    finally:
        sender.close()
    second.close()
    replayed = [f for f in second.lines if f["kind"] == "step"]
    assert {f["step"] for f in replayed} == set(range(20))
    assert all(f["grad_norms"] == [0.5, 0.25] for f in replayed)
