"""Where the monitor's frames come from: a live socket, a run log, or a list (tests).

A source is anything with ``async def run(monitor)``; the app runs it as a worker and
headless mode awaits it. Injecting it keeps the app testable without a socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from probes.kernel.wire import Address, Frame, FrameError
from tui.runlog import read_run_log
from tui.server import Connection, FrameSink, MonitorServer


class MonitorSink(FrameSink, Protocol):
    """What a source feeds: a ``Monitor``, or headless mode's (which composes one)."""

    token: str | None  # signs commands when the probe expects it

    def source_ended(self, reason: str) -> None: ...


class FrameSource(Protocol):
    """Feeds frames to a monitor until cancelled (or until it has no more)."""

    description: str

    async def run(self, monitor: MonitorSink) -> None: ...


class ServerSource:
    """Listen on an address and feed every connected probe's frames to the monitor."""

    def __init__(self, address: Address, *, token: str | None = None) -> None:
        self.address = address
        self.token = token
        self.description = f"listening on {address}"
        self.server: MonitorServer | None = None
        self.listening = asyncio.Event()

    async def run(self, monitor: MonitorSink) -> None:
        self.server = MonitorServer(self.address, monitor, token=self.token)
        monitor.token = self.token
        await self.server.start()
        self.description = f"listening on {self.server.bound_address}"
        self.listening.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            await self.server.close()


class FrameListSource:
    """Feed a fixed sequence of frames (a test, a snapshot), then stay idle."""

    def __init__(self, frames: Iterable[Frame | FrameError], description: str = "frames") -> None:
        self.frames = frames
        self.description = description

    async def run(self, monitor: MonitorSink) -> None:
        conn = Connection(0, self.description, None)
        for count, item in enumerate(self.frames):
            if isinstance(item, FrameError):
                monitor.frame_rejected(conn, str(item))
            else:
                monitor.frame_received(conn, item)
            if count % 512 == 511:
                await asyncio.sleep(0)  # let the screen breathe during a long replay
        monitor.source_ended("end of the run log")


class ReplaySource:
    """Feed recorded run logs (``traintop replay FILE [FILE ...]``), one after the
    other, each on a connection of its own (as the runs came to the monitor that
    recorded them), then mark their runs gone."""

    def __init__(self, *paths: str) -> None:
        self.paths = paths
        self.description = "replay of " + ", ".join(paths)

    async def run(self, monitor: MonitorSink) -> None:
        count = 0
        for conn_id, path in enumerate(self.paths):
            conn = Connection(conn_id, path, None)
            for item in read_run_log(path):
                if isinstance(item, FrameError):
                    monitor.frame_rejected(conn, str(item))
                else:
                    monitor.frame_received(conn, item)
                count += 1
                if count % 512 == 0:
                    await asyncio.sleep(0)  # let the screen breathe during a long replay
        monitor.source_ended("end of the run log")
