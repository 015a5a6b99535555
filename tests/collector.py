"""A stand-in monitor for tests of the training side: a thread that collects frames."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from probes.kernel.wire import Address, FrameError, FrameReader, encode_frame
from tests.waiting import poll, wait_until

Frame = dict[str, Any]


class FrameCollector:
    """Listen on a Unix socket and keep every frame probes send (thread-safe reads).

    ``reply`` (optional) is called with each frame and may return frames to send back.
    """

    def __init__(self, path: str, reply: Callable[[Frame], list[Frame]] | None = None) -> None:
        self.address = Address("unix", path=path)
        self.frames: list[Frame] = []
        self.errors: list[str] = []
        self._reply = reply
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen()
        self._server.settimeout(0.1)
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def kinds(self, kind: str) -> list[Frame]:
        with self._lock:
            return [f for f in self.frames if f["kind"] == kind]

    def wait_for(self, predicate: Callable[[list[Frame]], bool], timeout: float = 10.0) -> bool:
        """Whether ``predicate`` held, within ``timeout``, of the frames received."""

        def holds() -> bool:
            with self._lock:
                return predicate(list(self.frames))

        return bool(poll(holds, timeout))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        self._server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.address.path)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            # Set before close() can see it: a reader that starts after close() then
            # finds a closed socket (and returns), not one it must configure.
            conn.settimeout(0.1)
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        reader = FrameReader()
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            for item in reader.feed(data):
                if isinstance(item, FrameError):
                    with self._lock:
                        self.errors.append(str(item))
                    continue
                with self._lock:
                    self.frames.append(item)
                if self._reply is not None:
                    for frame in self._reply(item):
                        with contextlib.suppress(OSError):
                            conn.sendall(encode_frame(frame))


def watch_unthinned(model: Any, optimizer: Any, collector: FrameCollector, **options: Any) -> Any:
    """A probe that sends every step as its own frame (no rate thinning)."""
    import probes  # late: the collector itself needs no torch

    return probes.watch(model, optimizer, address=collector.address, max_steps_per_s=1e9, **options)


def wait_for_bye(collector: FrameCollector) -> None:
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames)), (
        "the probe never said bye"
    )


def wait_connected(probe: Any) -> None:
    """Wait for the probe's sender to reach the monitor: a run only pauses itself (guard,
    anomaly step) when a monitor is connected to resume it."""
    assert probe.sender.connected.wait(10), "the probe never connected"


def diagnose(frames: list[Frame]) -> tuple[list[Any], Any]:
    """The alerts the monitor's rules raise on these frames' step and eval records (to
    the run's end), and the diagnoser after them (its ``incidents`` hold what folded
    under each alert)."""
    from probes.kernel.diagnosis import Diagnoser, RunInfo

    hello = next(f for f in frames if f["kind"] == "hello")
    diagnoser = Diagnoser(RunInfo.from_hello(hello))
    alerts = []
    for frame in frames:
        if frame["kind"] in ("step", "eval"):
            alerts += [c.alert for c in diagnoser.observe(frame) if c.raised]
    return alerts + [c.alert for c in diagnoser.finish() if c.raised], diagnoser


def raised_alerts(frames: list[Frame]) -> list[Any]:
    """The alerts a monitor would raise on these frames: the diagnosis rules over the
    step and eval records, and the alerts the probe sent itself (the guard's)."""
    from probes.kernel.diagnosis import Alert, Diagnoser, RunInfo

    hello = next(f for f in frames if f["kind"] == "hello")
    diagnoser = Diagnoser(RunInfo.from_hello(hello))
    alerts = []
    for frame in frames:
        if frame["kind"] in ("step", "eval"):
            alerts += [change.alert for change in diagnoser.observe(frame) if change.raised]
        elif frame["kind"] == "alert":
            alerts.append(Alert.from_dict(frame["alert"]))
    return alerts


class LiveMonitor:
    """The real monitor (``tui.monitor.Monitor`` on a ``ServerSource``) in a background
    event loop: its state, the events it reported, and commands sent from the test."""

    def __init__(self, path: str) -> None:
        import asyncio

        from tui.monitor import Monitor
        from tui.sources import ServerSource
        from tui.state import MonitorState

        self.address = Address("unix", path=path)
        self.events: list[Any] = []
        self._lock = threading.Lock()
        self.monitor = Monitor(MonitorState(), on_events=self._note)
        self._loop = asyncio.new_event_loop()
        source = ServerSource(self.address)
        self._task: Any = None

        async def serve() -> None:
            self._task = asyncio.current_task()
            ticking = asyncio.ensure_future(self._tick_forever())
            try:
                await source.run(self.monitor)
            except asyncio.CancelledError:
                pass  # closed by the test
            finally:
                ticking.cancel()

        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(serve(),), daemon=True
        )
        self._thread.start()
        wait_until(source.listening.is_set, "the monitor to listen")

    async def _tick_forever(self) -> None:
        import asyncio

        while True:  # the clock of the real monitor (ranks gone quiet), not a wait
            await asyncio.sleep(0.5)
            self.monitor.tick()

    def _note(self, events: list[Any]) -> None:
        with self._lock:
            self.events += events

    def call(self, function: Callable[[], Any]) -> Any:
        """Run ``function`` on the monitor's loop (its state is that loop's alone)."""
        import concurrent.futures

        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(function())
            except Exception as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(10)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Poll ``predicate`` (run on the monitor's loop) until true or ``timeout``."""
        return bool(poll(lambda: self.call(predicate), timeout, every=0.05))

    def raised(self) -> list[Any]:
        """The alerts the monitor raised (as ALERT lines say them), in order."""
        from tui.events import AlertRaised

        with self._lock:
            return [e.alert for e in self.events if isinstance(e, AlertRaised)]

    def close(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(5)


def verdicts(alerts: list[Any]) -> list[Any]:
    """What a healthy run must not raise: its warnings and errors. Info notes are not
    verdicts on the training (the probe's own cost on a shared machine, a model frozen
    on purpose for linear probing); every kind counts, none is left out by name."""
    return [a for a in alerts if str(a.severity) != "info"]


def verdict_lines(stdout: str) -> list[str]:
    """The headless monitor's ALERT lines that are verdicts (warnings and errors), in
    order: what :func:`verdicts` keeps, read from a child's output. An info note such as
    the probe's own cost on a crowded machine comes and goes with the machine's load."""
    return [
        line
        for line in stdout.splitlines()
        if line.startswith("ALERT ") and line.split()[1] in ("warning", "error")
    ]
