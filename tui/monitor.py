"""The glue between a frame source and the monitor's state (no Textual, no torch).

``Monitor`` is the ``FrameSink`` the server (or a replay, or a test) feeds: it applies
each frame to ``MonitorState``, writes it to the run log when recording, and hands
notable events to a listener (the app notifies, headless mode prints).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from probes.kernel.commands import Command
from probes.kernel.schema import check_frame
from probes.kernel.schema.spec import FrameKind
from probes.kernel.wire import Frame, command_signature, make_frame
from tui.events import MonitorEvent
from tui.run import RunState
from tui.runlog import RunLogWriter
from tui.server import Connection
from tui.state import MonitorState

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
            self.frame_rejected(conn, f"bad {frame.get('kind')} frame: {type(exc).__name__}: {exc}")
            return
        self._record(frame)
        if frame["kind"] == FrameKind.HELLO:
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

    def send_command(self, run_id: str, command: Command | str, **args: object) -> str | None:
        """Send a command to a run's probe, or to every rank of its job; None if sent,
        else why not (one line). ``command`` is a ``Command`` or its value ("pause"); a
        string no ``Command`` has is sent as it is, and the probe refuses it in its ack.

        A job's ranks get the command for the same step boundary (``at_step``, chosen
        ahead of every rank), so no rank pauses while another waits for it in a
        collective; a paused job's ranks wait at one boundary and act at once."""
        name = command.value if isinstance(command, Command) else command  # the wire's
        run = self.state.runs.get(run_id)
        targets = [run_id]
        if run is not None and run.job is not None and run.job in self.state.jobs:
            job = self.state.jobs[run.job]
            members = [r for r in job.rank_runs(self.state.runs) if r.connected]
            targets = [r.run_id for r in members] or targets
            if len(members) > 1 and not any(r.control.get("paused") for r in members):
                args = {**args, "at_step": boundary_ahead(members)}
        sent = [self._send_one(target, name, args) for target in targets]
        problems = [p for p in sent if p is not None]
        return problems[0] if len(problems) == len(sent) else None

    def _send_one(self, run_id: str, name: str, args: dict[str, object]) -> str | None:
        conn = self.connections.get(run_id)
        if conn is None:
            return "that run is not connected"
        command_id = next(self._command_ids)
        frame = make_frame("command", id=command_id, run=run_id, command=name, args=args)
        if self.token:
            frame["auth"] = command_signature(self.token, run_id, command_id, name, args)
        conn.send(frame)
        return None

    def tick(self) -> None:
        """Time passes: what the state finds with it (a rank gone quiet) is reported."""
        self._emit(self.state.tick())

    def close(self) -> None:
        """Flush and close the run log, if recording."""
        if self._recorder is not None:
            self._recorder.close()

    def _emit(self, events: list[MonitorEvent]) -> None:
        if events and self.on_events is not None:
            self.on_events(events)


#: How far ahead of the furthest rank a job's command is scheduled: the records the
#: monitor has seen lag the ranks by a flush or two (tens of ms), more steps on a fast job.
AHEAD_S = 1.0
AHEAD_MIN_STEPS = 3


def boundary_ahead(ranks: list[RunState]) -> int:
    """A step boundary no rank has passed yet: the furthest rank's step, plus what the
    fastest rank runs in ``AHEAD_S`` (at least ``AHEAD_MIN_STEPS``)."""
    furthest = max(r.last_step for r in ranks)
    rate = max((r.steps_per_s or 0.0 for r in ranks), default=0.0)
    return furthest + max(AHEAD_MIN_STEPS, math.ceil(rate * AHEAD_S)) + 1
