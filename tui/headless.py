"""``traintop --headless``: the monitor without a screen, one line per event.

For logs, CI and machines without a terminal: prints a line when a run connects or
disconnects, one per alert and anomaly report, and a short summary every N steps. It
takes no keys, so a run that pauses itself (the guard, an anomaly step) is resumed at
once, with a line saying so.

Every line is machine-splittable: it splits as a POSIX shell splits words
(``shlex.split``), and what a line says of a run is in ``key=value`` words (after a
leading word or two: ``ALERT warning KIND``, ``PROBE OFF``). A value with a space, a
quote or a backslash in it, or none at all, is written in double quotes, JSON-style
(``\\"`` and ``\\\\`` inside), so that a name stays as the run spelled it:
``names="embed.weight, conv.weight"``, ``message="..."``; a list is its items joined
by commas. Whatever comes from a run (names, evidence, reasons, messages) is
first made plain (``tui.text``: no escape sequences, no control characters, bounded),
so that no line can drive the terminal it is printed on. Two runs on their own that
share a name are told apart in ``run=``: the later one's name takes a mark,
``run=mlp@10:42:07`` (when it started), else ``@host:pid``, else ``@`` its run id; a
run keeps the word it was first printed with. Each run's summary is printed when its
step passes a multiple of ``--summary-every`` and once at its end (not again when
nothing changed), and a run's root causes once at its end: a job's once, for all its
ranks, when the last of them has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import TextIO

from probes.kernel.diagnosis import Alert
from probes.kernel.diagnosis.book import AlertEntry, trips_fail_on
from probes.kernel.schema.spec import FrameKind
from probes.kernel.wire import Frame
from tui.dispatch import dispatch, handles
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
from tui.resources import summary_words
from tui.run import RunState
from tui.server import Connection
from tui.sources import FrameSource
from tui.state import MonitorState, run_marks
from tui.text import LINE_LIMIT, plain_line, plain_name

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
        self._summarised: dict[str, int] = {}  # run id -> the last step bucket summarised
        self._last_summary: dict[str, str] = {}  # run id -> its last summary line
        self._labels: dict[str, str] = {}  # run id -> its run= word, as first printed
        self._causes_said: set[str] = set()  # the jobs whose causes line is printed
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
        if frame["kind"] == FrameKind.STEP:
            run = self.state.runs.get(str(frame.get("run"))) or self.state.run_for(conn.id)
            if run is not None:
                self._maybe_summarise(run)
                self._fail_on_folded(run)

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
            self._summary(run)

    def _summary(self, run: RunState) -> None:
        """The run's summary line, unless the last one printed said the same (a last
        step that is a multiple of ``--summary-every`` is summarised once)."""
        line = summary_line(run, label=self._label(run))
        if self._last_summary.get(run.run_id) != line:
            self._last_summary[run.run_id] = line
            self._line(line)

    def _label(self, run: RunState) -> str:
        """The run's ``run=`` word: its name, marked when another run on its own was
        printed under that name (a job's ranks share theirs: ``job=`` tells them apart);
        fixed once printed, so that one word means one run all along a log."""
        label = self._labels.get(run.run_id)
        if label is None:
            name = plain_name(run.name)
            if run.job is not None:
                return word(name)
            taken = set(self._labels.values())
            marks = [mark for mark in run_marks(run) if mark]
            candidates = [name] + [f"{name}@{mark}" for mark in marks]
            label = next((c for c in map(word, candidates) if c not in taken), word(candidates[-1]))
            self._labels[run.run_id] = label
        return label

    @handles(RunConnected)
    def handle_run_connected(self, event: RunConnected) -> None:
        run, info = event.run, event.run.info
        self._line(
            f"connected run={self._label(run)}{job_words(run)} "
            f"host={word(info.host)} id={word(run.run_id)} "
            f"pid={info.pid} layers={len(run.layers)}"
        )
        if run.control.get("paused"):  # paused before we came: take the wheel
            self._line(
                f"PAUSED (when this monitor connected); resuming (headless) run={self._label(run)}"
            )
            self.send_command(run.run_id, "resume")

    @handles(RunDisconnected)
    def handle_run_disconnected(self, event: RunDisconnected) -> None:
        run = event.run
        for alert in run.book.unmeasured():  # the run ended with nothing measured
            if trips_fail_on(alert, self.fail_on, run_ended=True):
                self._fail(AlertRaised(run, alert))
        self._fail_on_folded(run)  # (a consequence folded as the run ended)
        self._causes(run)
        self._summary(run)
        self._line(
            f"disconnected run={self._label(run)}{job_words(run)} reason={word(event.reason)}"
        )
        if not any(other.connected for other in self.state.runs.values()):
            self.all_done.set()

    def _causes(self, run: RunState) -> None:
        """A run's causes line as it goes; a job's once, as its last rank goes."""
        job = self.state.jobs.get(run.job) if run.job else None
        if job is None:
            entries = run.book.causes()
        elif self.state.live(run) or job.job_id in self._causes_said:
            return
        else:
            self._causes_said.add(job.job_id)
            ranks = list(job.rank_runs(self.state.runs))
            unique = {id(entry): entry for member in ranks for entry in member.book.causes()}
            entries = sorted(unique.values(), key=lambda e: (e.alert.rung, e.alert.step))
        if entries:
            self._line(causes_line(run, label=self._label(run), entries=entries))

    @handles(FrameRejected)
    def handle_frame_rejected(self, event: FrameRejected) -> None:
        self._line(f"rejected frame from={word(event.peer)} message={word(event.message)}")

    @handles(AlertRaised)
    def handle_alert_raised(self, event: AlertRaised) -> None:
        self._line(f"{alert_line(event.alert)} run={self._label(event.run)}")
        if trips_fail_on(event.alert, self.fail_on):
            self._fail(event)

    @handles(RunPaused)
    def handle_run_paused(self, event: RunPaused) -> None:
        """A headless monitor takes no keys: say why the run paused, and resume it."""
        paused = f"PAUSED step={event.step} reason={word(event.reason)}"
        if self._replaying:
            self._line(f"(history) {paused} run={self._label(event.run)}")
            return
        self._line(f"{paused} - resuming (headless) run={self._label(event.run)}")
        self.send_command(event.run.run_id, "resume")

    @handles(ProbeSwitchedOff)
    def handle_probe_switched_off(self, event: ProbeSwitchedOff) -> None:
        self._line(f"PROBE OFF run={self._label(event.run)} message={word(event.message)}")

    @handles(AnomalyReported)
    def handle_anomaly_reported(self, event: AnomalyReported) -> None:
        self._line(
            self._history_mark() + anomaly_line(event.report) + f" run={self._label(event.run)}"
        )

    @handles(AckReceived)
    def handle_ack_received(self, event: AckReceived) -> None:
        ack = event.ack
        self._line(
            f"{self._history_mark()}ACK {word(ack.get('command'))} ok={word(ack.get('ok'))} "
            f"step={word(ack.get('step'))} result={word(ack.get('result', ''))} "
            f"run={self._label(event.run)}"
        )

    @handles(AlertCleared)
    def handle_alert_cleared(self, event: AlertCleared) -> None:
        self._line(
            f"CLEARED {word(event.alert.kind)} step={event.step} "
            f"subject={word(event.alert.subject or '-')} run={self._label(event.run)}"
        )

    def _history_mark(self) -> str:
        return "(history) " if self._replaying else ""

    def _fail_on_folded(self, run: RunState) -> None:
        """A consequence folded under a milder cause (a flat loss under an info-level
        ``mostly_frozen``) trips ``--fail-on`` as if raised: folding never lowers it."""
        if self.fail_on and self.failed_by is None:
            folded = run.book.folded_tripping(self.fail_on)
            if folded is not None:
                self._fail(AlertRaised(run, folded))

    def _fail(self, event: AlertRaised) -> None:
        """``--fail-on`` tripped (the first alert that does stops the monitor)."""
        if self.failed_by is None:
            self.failed_by = event
            self._line(
                f"failing: {event.alert.severity} alert {word(event.alert.kind)} "
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


# What must be quoted to stay one word: any space (a Unicode one too), a quote, a
# backslash (what shlex.split and a JSON string read alike once quoted).
_NEEDS_QUOTES = re.compile(r"[\s\"'\\]")
_NOT_IN_A_KEY = re.compile(r"[\s\"'\\=]")


def word(value: object, limit: int = LINE_LIMIT) -> str:
    """``value`` as one word of a headless line: plain (``tui.text.plain_line``, cut
    to ``limit``), in double quotes, JSON-style, when it is empty or holds a space, a
    quote or a backslash (``"embed.weight, conv.weight"``)."""
    text = plain_line(value, limit)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return json.dumps(text, ensure_ascii=False)  # (only \" and \\: controls are gone)


def evidence_value(value: object) -> str:
    """An evidence value as one word: a float to 4 significant digits, a list joined by
    commas (quoted as a whole when it must be), anything else as it is spelled."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return word(",".join(_spelled(item) for item in value))
    return word(value)


def _spelled(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else plain_line(value)


def alert_line(alert: Alert) -> str:
    """``ALERT <severity> <kind> step=<n> subject=<s> key=value ... [rank=R] [folded=...]``:
    the alert's evidence with every name intact (quoted where it must be)."""
    parts = [f"ALERT {alert.severity} {word(alert.kind)} step={alert.step}"]
    if alert.subject:
        parts.append(f"subject={word(alert.subject)}")
    for key, value in alert.evidence.items():
        parts.append(f"{_NOT_IN_A_KEY.sub('_', plain_name(key)) or '_'}={evidence_value(value)}")
    if alert.ranks and "rank" not in alert.evidence and "ranks" not in alert.evidence:
        parts.append(alert.rank_label)
    if alert.folded:
        parts.append(f"folded={evidence_value(alert.folded)}")
    return " ".join(parts)


def anomaly_line(report: Frame) -> str:
    """``ANOMALY step=N outcome=... backward_op=... module=... first_non_finite=...``."""
    first = report.get("first_non_finite") or {}
    parts = [f"ANOMALY step={word(report.get('step'))}", f"outcome={word(report.get('outcome'))}"]
    if report.get("backward_op"):
        parts.append(f"backward_op={word(report['backward_op'])}")
        parts.append(f"module={word(report.get('module_of_backward_op') or '-')}")
    if first:
        parts.append(f"first_non_finite={word(first.get('name'))}")
    if report.get("batch") is not None:
        parts.append(f"batch={word(report['batch'])}")
    parts.append(f"update_skipped={bool(report.get('update_skipped'))}")
    return " ".join(parts)


def causes_line(
    run: RunState, *, label: str | None = None, entries: list[AlertEntry] | None = None
) -> str:
    """``causes run=NAME in checklist order: rung/kind@step(subject+N) ...``: the run's
    alerts (or ``entries``: a job's), one per root cause, in the order of the lesson's
    checklist, each with how many more layers it concerns and what was folded under it.
    ``label``: the run's ``run=`` word (default: its name)."""
    parts = []
    for entry in run.book.causes() if entries is None else entries:
        alert = entry.alert
        others = len(alert.layers) - 1 if alert.subject in alert.layers else 0
        where = plain_name(alert.subject or "run") + (f"+{others}" if others > 0 else "")
        folded = f" folded={evidence_value(alert.folded)}" if alert.folded else ""
        parts.append(
            word(f"{alert.rung.tag}/{plain_name(alert.kind)}@{alert.step}({where})") + folded
        )
    name = word(plain_name(run.name)) if label is None else label
    job = f" job={word(run.job)}" if run.job else ""  # (a job's causes: all its ranks')
    return f"causes run={name}{job} in checklist order: " + " ".join(parts)


def job_words(run: RunState, *, world: bool = True) -> str:
    """`` job=JOB rank=R/W`` for a rank of a multi-rank job (`` rank=R`` without
    ``world``); "" for a run on its own."""
    if run.job is None:
        return ""
    if not world:
        return f" rank={run.rank}"
    return f" job={word(run.job)} rank={run.rank}/{run.world_size}"


def summary_line(run: RunState, *, label: str | None = None) -> str:
    """``run=... step=N loss=... val_loss=V@STEP grad_norm=... steps/s=... dropped=N
    alerts=N raised=N`` (the validation loss with the step it was taken at; ``alerts``:
    active now; ``raised``: since the run began), with the phases' shares and the memory
    after the speed when measured (``tui.resources.summary_words``). ``label``: the run's ``run=``
    word (default: its name)."""
    rate = run.steps_per_s
    val = validation_label(run)
    name = word(plain_name(run.name)) if label is None else label
    parts = [
        f"run={name}{job_words(run, world=False)}",
        f"step={run.last_step}",
        f"loss={number(run.loss)}",
    ]
    if val is not None:
        parts.append(f"val_loss={val}")
    parts += [
        f"grad_norm={number(run.grad_total.latest)}",
        f"steps/s={'-' if rate is None else f'{rate:.1f}'}",
        *summary_words(run.resources),
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
