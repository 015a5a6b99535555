"""The glue between a frame source and the monitor's state (no Textual, no torch).

``Monitor`` is the ``FrameSink`` the server (or a replay, or a test) feeds: it applies
each frame to ``MonitorState``, writes it to the run log when recording, and hands
notable events to a listener (the app notifies, headless mode prints).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from probes.wire import Frame, command_signature, make_frame
from tui.fields import check_frame
from tui.runlog import RunLogWriter
from tui.server import Connection
from tui.state import MonitorEvent, MonitorState

EventListener = Callable[[list[MonitorEvent]], None]


class Monitor:
    """Apply frames to a ``MonitorState``; record them; report what happened."""

    def __init__(
        self,
        state: MonitorState | None = None,
        *,
        record_path: str | None = None,
        on_events: EventListener | None = None,
    ) -> None:
        self.state = state or MonitorState()
        self.on_events = on_events
        self.connections: dict[str, Connection] = {}  # run id -> live connection
        self.token: str | None = None  # signs commands when the probe expects it
        self._recorder = RunLogWriter(record_path) if record_path else None
        self._command_ids = itertools.count(1)

    def frame_received(self, conn: Connection, frame: Frame) -> None:
        try:
            check_frame(frame)
            events = self.state.apply(conn.id, frame)
        except ValueError as exc:  # it decoded, but its fields are not a probe's
            self.frame_rejected(conn, f"bad {frame.get('kind')} frame: {exc}")
            return
        except Exception as exc:  # a value no check foresaw: reject it, keep the run
            self.frame_rejected(conn, f"bad {frame.get('kind')} frame: {type(exc).__name__}: "
                                      f"{exc}")
            return
        self._record(frame)
        if frame["kind"] == "hello":
            self.connections[str(frame.get("run"))] = conn
        self._emit(events)

    def _record(self, frame: Frame) -> None:
        if self._recorder is None:
            return
        try:
            self._recorder.write({k: v for k, v in frame.items() if k != "token"})
        except (OSError, ValueError) as exc:  # a full disk must not stop the live view
            self._recorder = None
            self._emit([self.state.reject("recording", f"recording stopped: {exc}")])

    def frame_rejected(self, conn: Connection, message: str) -> None:
        run = self.state.run_for(conn.id)  # name the run, when the sender said hello
        self._emit([self.state.reject(run.name if run else conn.peer, message)])

    def connection_closed(self, conn: Connection, reason: str) -> None:
        run = self.state.run_for(conn.id)
        if run is not None and self.connections.get(run.run_id) is conn:
            del self.connections[run.run_id]
        self._emit(self.state.connection_closed(conn.id, reason))

    def source_ended(self, reason: str) -> None:
        """The source has no more frames (a replay is over): its runs are gone."""
        self._emit(self.state.mark_offline(reason))

    def send_command(self, run_id: str, command: str, **args: object) -> str | None:
        """Send a command to a run's probe; None if sent, else why not (one line)."""
        conn = self.connections.get(run_id)
        if conn is None:
            return "that run is not connected"
        command_id = next(self._command_ids)
        frame = make_frame("command", id=command_id, run=run_id, command=command, args=args)
        if self.token:
            frame["auth"] = command_signature(self.token, run_id, command_id, command, args)
        conn.send(frame)
        return None

    def close(self) -> None:
        """Flush and close the run log, if recording."""
        if self._recorder is not None:
            self._recorder.close()

    def _emit(self, events: list[MonitorEvent]) -> None:
        if events and self.on_events is not None:
            self.on_events(events)
