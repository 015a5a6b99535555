"""``traintop --headless``: the monitor without a screen, one line per event.

For logs, CI and machines without a terminal: prints a line when a run connects or
disconnects, one per alert and anomaly report, and a short summary every N steps. It
takes no keys, so a run that pauses itself (the guard, an anomaly step) is resumed at
once, with a line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import TextIO

from probes.kernel.diagnosis.book import trips_fail_on
from probes.kernel.wire import Frame
from tui.dispatch import dispatch
from tui.events import (
    AckReceived,
    AlertCleared,
    AlertRaised,
    AnomalyReported,
    FrameRejected,
    ProbeSwitchedOff,
    RunConnected,
    RunDisconnected,
    RunPaused,
)
from tui.format import number, validation_label
from tui.monitor import Monitor
from tui.run import RunState
from tui.server import Connection
from tui.sources import FrameSource
from tui.state import MonitorState

ALERT_EXIT_STATUS = 3  # --fail-on: an alert of that severity or worse fired
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # end the monitor as Ctrl-C does


class HeadlessMonitor:
    """The monitor without a screen: a ``Monitor`` (composed, not extended) whose events
    are printed, one line each; it is the sink a frame source feeds.

    Args:
        out: where lines go (None: ``sys.stdout`` at the time of each line).
        summary_every: a summary line per run every this many steps.
        record_path: write every received frame to this run log.
        fail_on: stop (status 3) once an alert this severe or worse is raised.
        state: the monitor state to feed (its thresholds, in the CLI).
    """

    def __init__(
        self,
        *,
        out: TextIO | None = None,
        summary_every: int = 100,
        record_path: str | None = None,
        fail_on: str | None = None,
        state: MonitorState | None = None,
    ) -> None:
        self.monitor = Monitor(
            state, record_path=record_path, on_events=lambda events: dispatch(events, self)
        )
        self.out = out  # None: whatever sys.stdout is when a line is printed
        self.summary_every = max(1, summary_every)
        self.fail_on = fail_on
        self.failed_by: AlertRaised | None = None  # the alert that tripped --fail-on
        self.all_done = asyncio.Event()
        self.output_closed = asyncio.Event()  # stdout's reader went away: stop
        self._summarised: dict[str, int] = {}
        self._replaying = False  # the frame being applied is history sent on connect

    # --- the frame sink (what sources feed), passed on to the monitor ------------------

    @property
    def state(self) -> MonitorState:
        return self.monitor.state

    @property
    def token(self) -> str | None:
        return self.monitor.token

    @token.setter
    def token(self, token: str | None) -> None:
        self.monitor.token = token

    def frame_received(self, conn: Connection, frame: Frame) -> None:
        # A monitor that connects late gets the run's history first: its pauses, acks
        # and anomaly reports are printed as history, and an old pause is not resumed.
        self._replaying = bool(frame.get("replayed"))
        self.monitor.frame_received(conn, frame)
        if frame["kind"] == "step":
            run = self.state.runs.get(str(frame.get("run"))) or self.state.run_for(conn.id)
            if run is not None:
                self._maybe_summarise(run)

    def frame_rejected(self, conn: Connection, message: str) -> None:
        self.monitor.frame_rejected(conn, message)

    def connection_closed(self, conn: Connection, reason: str) -> None:
        self.monitor.connection_closed(conn, reason)

    def source_ended(self, reason: str) -> None:
        self.monitor.source_ended(reason)

    def send_command(self, run_id: str, command: str, **args: object) -> str | None:
        return self.monitor.send_command(run_id, command, **args)

    def tick(self) -> None:
        self.monitor.tick()

    def close(self) -> None:
        self.monitor.close()

    # --- what is printed -------------------------------------------------------------

    def _maybe_summarise(self, run: RunState) -> None:
        bucket = run.last_step // self.summary_every
        if bucket > self._summarised.get(run.run_id, -1):
            self._summarised[run.run_id] = bucket
            self._line(summary_line(run))

    def handle_run_connected(self, event: RunConnected) -> None:
        info = event.run.info
        self._line(
            f"connected run={event.run.name}{job_words(event.run)} "
            f"host={info.host} id={event.run.run_id} "
            f"pid={info.pid} layers={len(event.run.layers)}"
        )
        if event.run.control.get("paused"):  # paused before we came: take the wheel
            self._line(
                f"PAUSED (when this monitor connected); resuming (headless) run={event.run.name}"
            )
            self.send_command(event.run.run_id, "resume")

    def handle_run_disconnected(self, event: RunDisconnected) -> None:
        for alert in event.run.book.unmeasured():  # the run ended with nothing measured
            if trips_fail_on(alert, self.fail_on, run_ended=True):
                self._fail(AlertRaised(event.run, alert))
        if any(not entry.withdrawn for entry in event.run.raised_alerts):
            self._line(causes_line(event.run))
        self._line(summary_line(event.run))
        self._line(f"disconnected run={event.run.name}{job_words(event.run)} reason={event.reason}")
        if not any(run.connected for run in self.state.runs.values()):
            self.all_done.set()

    def handle_frame_rejected(self, event: FrameRejected) -> None:
        self._line(f"rejected frame from={event.peer}: {event.message}")

    def handle_alert_raised(self, event: AlertRaised) -> None:
        self._line(f"{event.alert.line()} run={event.run.name}")
        if trips_fail_on(event.alert, self.fail_on):
            self._fail(event)

    def handle_run_paused(self, event: RunPaused) -> None:
        """A headless monitor takes no keys: say why the run paused, and resume it."""
        if self._replaying:
            self._line(
                f"(history) PAUSED step={event.step} reason={event.reason!r} run={event.run.name}"
            )
            return
        self._line(
            f"PAUSED step={event.step} reason={event.reason!r}; resuming (headless) "
            f"run={event.run.name}"
        )
        self.send_command(event.run.run_id, "resume")

    def handle_probe_switched_off(self, event: ProbeSwitchedOff) -> None:
        self._line(f"PROBE OFF run={event.run.name}: {event.message}")

    def handle_anomaly_reported(self, event: AnomalyReported) -> None:
        self._line(self._history_mark() + anomaly_line(event.report) + f" run={event.run.name}")

    def handle_ack_received(self, event: AckReceived) -> None:
        ack = event.ack
        self._line(
            f"{self._history_mark()}ACK {ack.get('command')} ok={ack.get('ok')} "
            f"step={ack.get('step')} {ack.get('result', '')} run={event.run.name}"
        )

    def handle_alert_cleared(self, event: AlertCleared) -> None:
        self._line(
            f"CLEARED {event.alert.kind} step={event.step} "
            f"subject={event.alert.subject or '-'} run={event.run.name}"
        )

    def _history_mark(self) -> str:
        return "(history) " if self._replaying else ""

    def _fail(self, event: AlertRaised) -> None:
        """``--fail-on`` tripped (the first alert that does stops the monitor)."""
        if self.failed_by is None:
            self.failed_by = event
            self._line(
                f"failing: {event.alert.severity} alert {event.alert.kind} "
                f"(--fail-on {self.fail_on})"
            )
            self.all_done.set()

    def _line(self, text: str) -> None:
        if self.output_closed.is_set():
            return
        try:
            print(text, file=self.out or sys.stdout, flush=True)
        except BrokenPipeError:
            # The reader went away (``traintop --headless | head``): stop, as Unix tools
            # do, and point stdout at /dev/null so the exit flush does not fail again.
            self.output_closed.set()
            if self.out is None:
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def _companion_gone(companion: Callable[[], int | None], monitor: HeadlessMonitor) -> None:
    """Return once the companion process has exited and no run of it is connected."""
    while True:
        await asyncio.sleep(0.25)
        status = companion()
        if status is not None and not any(r.connected for r in monitor.state.runs.values()):
            if status != 0:
                monitor._line(f"the trainer exited with status {status}")
            return


def anomaly_line(report: Frame) -> str:
    """``ANOMALY step=N outcome=... backward_op=... module=... first_non_finite=...``."""
    first = report.get("first_non_finite") or {}
    parts = [f"ANOMALY step={report.get('step')}", f"outcome={report.get('outcome')}"]
    if report.get("backward_op"):
        parts.append(f"backward_op={report['backward_op']}")
        parts.append(f"module={report.get('module_of_backward_op') or '-'}")
    if first:
        parts.append(f"first_non_finite={first.get('name')}")
    if report.get("batch") is not None:
        parts.append(f"batch={report['batch']}")
    parts.append(f"update_skipped={bool(report.get('update_skipped'))}")
    return " ".join(parts)


def causes_line(run: RunState) -> str:
    """``causes run=NAME in checklist order: rung/kind@step(subject +N) ...``: the run's
    alerts, one per root cause, in the order of the lesson's checklist, each with how
    many more layers it concerns and what was folded under it."""
    parts = []
    for entry in run.book.causes():
        alert = entry.alert
        others = len(alert.layers) - 1 if alert.subject in alert.layers else 0
        where = (alert.subject or "run") + (f" +{others}" if others > 0 else "")
        folded = f" folded={','.join(alert.folded)}" if alert.folded else ""
        parts.append(
            f"{alert.rung.tag}/{alert.kind}@{alert.step}({where.replace(' ', '')}){folded}"
        )
    return f"causes run={run.name} in checklist order: " + " ".join(parts)


def job_words(run: RunState, *, world: bool = True) -> str:
    """`` job=JOB rank=R/W`` for a rank of a multi-rank job (`` rank=R`` without
    ``world``); "" for a run on its own."""
    if run.job is None:
        return ""
    if not world:
        return f" rank={run.rank}"
    return f" job={run.job} rank={run.rank}/{run.world_size}"


def summary_line(run: RunState) -> str:
    """``run=... step=N loss=... val_loss=V@STEP grad_norm=... steps/s=... dropped=N
    alerts=N raised=N`` (the validation loss with the step it was taken at; ``alerts``:
    active now; ``raised``: since the run began)."""
    rate = run.steps_per_s
    val = validation_label(run)
    parts = [
        f"run={run.name}{job_words(run, world=False)}",
        f"step={run.last_step}",
        f"loss={number(run.loss)}",
    ]
    if val is not None:
        parts.append(f"val_loss={val}")
    parts += [
        f"grad_norm={number(run.grad_total.latest)}",
        f"steps/s={'-' if rate is None else f'{rate:.1f}'}",
        f"dropped={run.dropped}",
        f"alerts={len(run.active_alerts)}",
        f"raised={len(run.raised_alerts)}",
    ]
    return " ".join(parts)


async def _tick_forever(monitor: HeadlessMonitor, every_s: float = 1.0) -> None:
    """Let time pass in the monitor's state, once a second (it never returns)."""
    while True:
        await asyncio.sleep(every_s)
        monitor.tick()


async def run_headless(
    source: FrameSource,
    monitor: HeadlessMonitor,
    *,
    exit_when_done: bool = False,
    companion: Callable[[], int | None] | None = None,
) -> int:
    """Run ``source`` into ``monitor`` until it ends (a replay), until interrupted, or,
    with ``exit_when_done``, until every run that connected has gone; with the
    monitor's ``fail_on``, also as soon as an alert that bad fires.

    Returns the exit status: ``ALERT_EXIT_STATUS`` if ``fail_on`` tripped, else 0."""
    feeding = asyncio.create_task(source.run(monitor))
    terminated = asyncio.Event()  # SIGTERM, SIGHUP: stop like Ctrl-C, closing the socket
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signum, terminated.set)
    listening = getattr(source, "listening", None)
    if isinstance(listening, asyncio.Event):  # a socket: say where, once it is bound
        waiting = asyncio.create_task(listening.wait())
        await asyncio.wait({waiting, feeding}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if listening.is_set():
            monitor._line(source.description)
    waiters = {
        feeding,
        asyncio.create_task(monitor.output_closed.wait()),
        asyncio.create_task(terminated.wait()),
    }
    if exit_when_done or monitor.fail_on:
        waiters.add(asyncio.create_task(monitor.all_done.wait()))
    if companion is not None:
        waiters.add(asyncio.create_task(_companion_gone(companion, monitor)))
    waiters.add(asyncio.create_task(_tick_forever(monitor)))  # ranks gone quiet
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if feeding in done and feeding.exception() is not None:
            raise feeding.exception()  # type: ignore[misc]
    finally:
        for task in waiters:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        monitor.close()
        for signum in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signum)
    return ALERT_EXIT_STATUS if monitor.failed_by is not None else 0
