"""The monitor's state: every run it has seen, and the jobs their ranks form (pure data,
no widgets, no I/O).

``MonitorState`` takes frames as they arrive (from a socket, a file or a test) and keeps
one ``RunState`` per run (``tui.run``) and one ``JobState`` per multi-rank job
(``tui.jobs``). Widgets read it and redraw at a fixed frame rate; headless mode prints
from the events (``tui.events``) that ``apply`` returns.
"""

from __future__ import annotations

import contextlib
import time

from probes.kernel.diagnosis import Alert, AlertChange, Thresholds
from probes.kernel.diagnosis.book import AlertBook
from probes.kernel.endings import CLOSED
from probes.kernel.schema import EvalView, RunInfo, StepView
from probes.kernel.schema.spec import EventName, FrameKind
from probes.kernel.wire import Frame
from tui.events import (
    AckReceived,
    AlertCleared,
    AlertRaised,
    AnomalyReported,
    FrameRejected,
    MonitorEvent,
    ProbeSwitchedOff,
    RunConnected,
    RunDisconnected,
    RunPaused,
)
from tui.jobs import JobState
from tui.run import MAX_ALERTS, AlertEntry, RunState
from tui.text import plain_name

MAX_ENDED_RUNS = 50  # runs that have gone, kept for viewing (about 1 MB each)

__all__ = [
    "MAX_ENDED_RUNS",
    "AlertEntry",
    "MonitorEvent",
    "MonitorState",
    "RunState",
    "run_marks",
    "told_apart",
]


class MonitorState:
    """All runs the monitor has seen, fed by ``apply`` one frame at a time."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self.runs: dict[str, RunState] = {}
        self.version = 0  # bumped on every change, so views redraw only when needed
        self.rejected_frames = 0
        self.last_rejection = ""
        self.jobs: dict[str, JobState] = {}  # multi-rank jobs, by job id
        self._conn_runs: dict[int, str] = {}

    def run_for(self, conn_id: int) -> RunState | None:
        run_id = self._conn_runs.get(conn_id)
        return None if run_id is None else self.runs.get(run_id)

    def apply(self, conn_id: int, frame: Frame) -> list[MonitorEvent]:
        """Take one frame from connection ``conn_id``; return what happened of note."""
        kind = frame["kind"]
        self.version += 1
        if kind == FrameKind.HELLO:
            return self._hello(conn_id, frame)
        run = self.runs.get(str(frame.get("run", ""))) or self.run_for(conn_id)
        if run is None:
            return [self.reject(f"conn {conn_id}", f"a {kind} frame before any hello")]
        run.last_frame_at = time.monotonic()
        if not self._fresh(run, frame):
            return []
        if kind == FrameKind.STEP:
            view = StepView.from_record(frame)  # parsed once, for the state and diagnosis
            if not run.apply_step(view):
                return [
                    self.reject(
                        run.name, f"step {frame['step']} is not after step {run.last_step}: dropped"
                    )
                ]
            changes = run.diagnose(view)
            if run.book.awaiting_a_step:
                changes += self._ended_by_a_step(run, view.first)
            return self._job_incidents(run) + self._alert_events(run, changes)
        if kind == FrameKind.EVAL:
            eval_view = EvalView.from_record(frame)
            run.apply_eval(eval_view)
            return self._alert_events(run, run.diagnose(eval_view))
        if kind == FrameKind.ALERT:
            return self._probe_alert(run, frame)
        if kind == FrameKind.ACK:
            run.control.update(frame.get("state") or {})
            return [AckReceived(run, frame)]
        if kind == FrameKind.ANOMALY:
            run.control.update(frame.get("state") or {})
            run.anomaly_reports.append(frame)
            del run.anomaly_reports[:-MAX_ALERTS]
            run.book.anomaly_report(frame)  # the producer joins the non-finite incident
            return [AnomalyReported(run, frame)]
        if kind == FrameKind.BYE:
            run.ended = True
            run.end_reason = str(frame.get("reason") or CLOSED)
            return self._alert_events(run, run.finish_diagnosis(), force=True)
        return self._event(run, frame)

    @staticmethod
    def _event(run: RunState, frame: Frame) -> list[MonitorEvent]:
        name = frame.get("name")
        run.control.update(frame.get("state") or {})
        if name == EventName.CHECK_REPORT:
            run.check_reports.append(frame)
            del run.check_reports[:-MAX_ALERTS]
            return []
        run.events.append(frame)
        if name == EventName.PAUSED:
            return [
                RunPaused(run, int(frame.get("step", run.last_step)), str(frame.get("reason", "")))
            ]
        if name == EventName.PROBE_ERROR:
            run.probe_error = str(frame.get("message", "unknown error"))
            return [ProbeSwitchedOff(run, run.probe_error)]
        return []

    def _alert_events(
        self, run: RunState, changes: list[AlertChange], *, force: bool = False
    ) -> list[MonitorEvent]:
        """The events of a run's alerts raised or cleared; a rank's go through its job
        (held until every rank has reported their step, joined, folded)."""
        job = self.jobs.get(run.job) if run.job else None
        if job is None:
            return [
                AlertRaised(run, c.alert) if c.raised else AlertCleared(run, c.alert, run.last_step)
                for c in changes
            ]
        if not changes and not force and not job.diagnoser.holding:
            return []  # nearly every record of a rank: nothing raised, cleared or waiting
        job.hold(run, [c.alert for c in changes if c.raised])
        events: list[MonitorEvent] = [
            AlertCleared(run, c.alert, run.last_step)
            for c in changes
            if not c.raised and job.raised_by(run.rank, c.alert.key)
        ]
        return events + self._release(job, force=force)

    def _release(self, job: JobState, *, force: bool = False) -> list[MonitorEvent]:
        raised, folded = job.release(self.runs, time.monotonic(), force=force)
        for run, alert, incident_kind in folded:  # shown under the job's incident
            run.book.fold_under(alert, incident_kind)
        for run, alert in raised:
            if job.diagnoser.speaks_for_every_rank(alert):
                self._share_finding(job, run, alert)
        return [AlertRaised(run, alert) for run, alert in raised]

    def _share_finding(self, job: JobState, run: RunState, alert: Alert) -> None:
        """Rank 0's finding for every rank (DDP: its replica rules') is shown in every
        rank's alerts: its entry, one for all (it clears for all as it clears on rank 0)."""
        entry = run.book.entry_for(alert)
        if entry is None:
            return
        for member in job.rank_runs(self.runs):
            if member is not run:
                member.book.share(entry)

    def _job_incidents(self, run: RunState) -> list[MonitorEvent]:
        """The cross-rank checks over a rank's step record (as its diagnosis just read
        it); an incident is shown in every rank's alerts (one entry, shared)."""
        job = self.jobs.get(run.job) if run.job else None
        view = run.diagnoser.last_view
        if job is None or view is None:
            return []
        return self._share_incidents(job, job.observe_step(run, view, self.runs))

    def _share_incidents(
        self, job: JobState, found: list[tuple[RunState, Alert]]
    ) -> list[MonitorEvent]:
        """A job's incidents (each with the run it names), entered in every rank's book;
        each raised unless a cause of rank 0's explains it (then kept folded under that,
        as the ranks' own consequences are)."""
        events: list[MonitorEvent] = []
        for named, alert in found:
            entry = job.diagnoser.entry_of(alert)
            for member in job.rank_runs(self.runs):
                member.book.share(entry)
            if not entry.folded_under:
                events.append(AlertRaised(named, alert))
        return events

    def _ended_by_a_step(self, run: RunState, step: int) -> list[AlertChange]:
        """The probe said no step had begun; one has: those alerts clear."""
        ended = run.book.first_measured_step(step)
        job = self.jobs.get(run.job) if run.job else None
        if job is not None:
            for alert in ended:
                job.withdraw(run.rank, alert.key)  # (not raised yet: never raise it)
        return [AlertChange(alert, raised=False) for alert in ended]

    def _probe_alert(self, run: RunState, frame: Frame) -> list[MonitorEvent]:
        try:
            alert = Alert.from_dict(frame.get("alert") or {})
        except (KeyError, TypeError, ValueError) as exc:
            return [self.reject(run.name, f"an alert frame without a valid alert: {exc}")]
        if not run.book.probe_alert(alert, steps_seen=run.last_step >= 0):
            return []  # steps are measured already (a history replayed out of order)
        job = self.jobs.get(run.job) if run.job else None
        if job is None:
            return [AlertRaised(run, alert)]
        job.hold(run, [alert])
        return self._release(job)

    # --- which run the views show, and how runs of one name are told apart -------------

    def takes_the_view(self, run: RunState, shown: RunState | None) -> bool:
        """True if the views should move to ``run``, which has just connected, from the
        run they show: when they show none; when ``shown`` has gone, and every rank of
        its job with it (a new run takes over from an ended one, never from a live one a
        person is looking at); when ``run`` is rank 0 of the job whose other rank is
        shown (a job's views start on rank 0)."""
        if shown is None:
            return True
        if shown.run_id == run.run_id:
            return False
        if run.job is not None and run.job == shown.job:
            return run.rank == 0 and shown.rank != 0
        return not self.live(shown)

    def live(self, run: RunState) -> bool:
        """True while ``run``, or another rank of its job, is connected."""
        job = self.jobs.get(run.job) if run.job else None
        if job is None:
            return run.connected
        return job.has_live_rank(self.runs)

    def told_apart(self, run: RunState) -> str | None:
        """What tells ``run`` apart from the other runs of its name (``run_marks``), or
        None when no other run on its own has its name. (A job's ranks share a name:
        their rank tells them apart; ``job_told_apart`` tells jobs apart.)"""
        namesakes = [
            other
            for other in self.runs.values()
            if other.job is None and other.name == run.name and other.run_id != run.run_id
        ]
        return told_apart(run_marks(run), [run_marks(other) for other in namesakes])

    def job_told_apart(self, job: JobState) -> str | None:
        """What tells ``job`` apart from the other jobs of its name (when its first rank
        started, or its id), or None when no other job has its name."""

        def marks(one: JobState) -> tuple[str, ...]:
            first = next(one.rank_runs(self.runs), None)
            return (run_marks(first)[0] if first else "", plain_name(one.job_id))

        namesakes = [
            other
            for other in self.jobs.values()
            if other.name == job.name and other.job_id != job.job_id
        ]
        return told_apart(marks(job), [marks(other) for other in namesakes])

    def tick(self, now: float | None = None) -> list[MonitorEvent]:
        """Time passes (the views call this about once a second): ranks that went quiet
        while others went on, and alerts held too long for a rank that never came."""
        now = time.monotonic() if now is None else now
        events: list[MonitorEvent] = []
        for job in self.jobs.values():
            events += self._share_incidents(job, job.quiet_ranks(self.runs, now))
            events += self._share_incidents(job, job.stall_due(self.runs, now))
            events += self._release(job)
        if events:
            self.version += 1
        return events

    def connection_closed(self, conn_id: int, reason: str) -> list[MonitorEvent]:
        """The connection ``conn_id`` is gone; mark its run disconnected."""
        run_id = self._conn_runs.pop(conn_id, None)
        run = None if run_id is None else self.runs.get(run_id)
        if run is None:
            return []
        self.version += 1
        run.connected = False
        run.gone_at = time.monotonic()
        run.disconnect_reason = run.why_gone(reason)
        job = self.jobs.get(run.job) if run.job else None
        if job is None or not job.has_live_rank(self.runs):
            # (a rank gone while another of its job is there ends nothing that could be
            # forgotten; scanning every run at each close of a 1,024-rank job's end took
            # the monitor 0.4 s)
            self._forget_old_runs()
            job = self.jobs.get(run.job) if run.job else None  # (unless just forgotten)
        events = self._alert_events(run, run.finish_diagnosis(), force=True)
        if job is not None:
            clean = run.ended and run.end_reason == CLOSED
            events += self._share_incidents(job, job.rank_gone(run, clean, self.runs))
        return [*events, RunDisconnected(run, run.disconnect_reason)]

    def _forget_old_runs(self) -> None:
        """Keep the ``MAX_ENDED_RUNS`` runs (or jobs, a job's ranks counting as one)
        that went last: a monitor left up for weeks of jobs must not grow without bound.
        Live runs, and every rank of a job with a live rank, are always kept. The oldest
        gone go first (a job that outlived many short runs is kept when it ends, not
        forgotten for having started first)."""
        live_jobs = {run.job for run in self.runs.values() if run.connected and run.job}
        ended: dict[str, list[RunState]] = {}  # run or job -> its runs
        for run in self.runs.values():
            if not run.connected and run.job not in live_jobs:
                ended.setdefault(run.job or run.run_id, []).append(run)
        if len(ended) <= MAX_ENDED_RUNS:
            return
        by_end = sorted(ended, key=lambda key: max(run.gone_at for run in ended[key]))
        for key in by_end[: len(ended) - MAX_ENDED_RUNS]:
            for run in ended[key]:
                del self.runs[run.run_id]
            self.jobs.pop(key, None)

    def mark_offline(self, reason: str) -> list[MonitorEvent]:
        """Mark every connected run as gone (the end of a replay)."""
        self.version += 1
        events: list[MonitorEvent] = []
        for job in self.jobs.values():  # a rank gone with an error, the others not
            events += self._share_incidents(job, job.stall_due(self.runs, 0.0, force=True))
        for run in self.runs.values():
            if run.connected:
                run.connected = False
                run.gone_at = time.monotonic()
                run.disconnect_reason = run.why_gone(reason)
                events.append(RunDisconnected(run, run.disconnect_reason))
        self._conn_runs.clear()
        return events

    def reject(self, peer: str, message: str) -> FrameRejected:
        """Count a frame that could not be accepted."""
        self.version += 1
        self.rejected_frames += 1
        self.last_rejection = message
        return FrameRejected(peer, message)

    def _hello(self, conn_id: int, frame: Frame) -> list[MonitorEvent]:
        run_id = str(frame.get("run") or f"conn-{conn_id}")
        seen_before = run_id in self.runs
        run = self.runs.get(run_id) or RunState(run_id, book=AlertBook(self.thresholds))
        self.runs[run_id] = run
        self._conn_runs[conn_id] = run_id
        run.apply_hello(RunInfo.from_hello(frame))
        run.last_frame_at = time.monotonic()
        if run.job is not None:
            job = self.jobs.get(run.job)
            if job is None:
                job = self.jobs[run.job] = JobState(
                    run.job, run.name, run.world_size, self.thresholds
                )
            job.add_rank(run)
        return [RunConnected(run, replayed=seen_before)]

    @staticmethod
    def _fresh(run: RunState, frame: Frame) -> bool:
        """False for a frame already applied (a history replayed on reconnect)."""
        seq = frame.get("seq")
        if not isinstance(seq, int):
            return True
        kind = frame["kind"]
        if seq <= run.last_seq.get(kind, 0):
            return False
        run.last_seq[kind] = seq
        return True


def run_marks(run: RunState) -> tuple[str, str, str]:
    """What can tell a run from another of the same name, the most readable first: when
    it started (``HH:MM:SS``, local time, from its hello; "" if unknown), where it runs
    (``host:pid``) and its run id (unique); plain text, from the run's own words."""
    started = ""
    if run.info.started is not None:
        with contextlib.suppress(OverflowError, OSError, ValueError):  # (a hostile time)
            started = time.strftime("%H:%M:%S", time.localtime(run.info.started))
    where = f"{plain_name(run.info.host or '?')}:{run.info.pid or '?'}"
    return started, where, plain_name(run.run_id)


def told_apart(marks: tuple[str, ...], others: list[tuple[str, ...]]) -> str | None:
    """The first of ``marks`` that no one of ``others`` shares (None if ``others`` is
    empty; the last mark if none is unshared)."""
    if not others:
        return None
    for index, mark in enumerate(marks):
        if mark and all(other[index] != mark for other in others):
            return mark
    return marks[-1]
