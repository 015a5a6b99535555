"""The ranks of one distributed job, as one job in the monitor (pure: no widgets, no I/O).

Each rank is a run of its own (``RunState``: its own curves, layer table and alert
book). ``JobState`` sees them together:

- its ``diagnoser`` (``probes.kernel.diagnosis.job``): the cross-rank checks over every
  rank's step records, and one alert per root cause across ranks (a rank's alert waits
  for every rank's record of its step, then is joined or folded under the job's
  incident); ``JobState`` tells it which runs are its ranks and how far each has come;
- per-rank numbers for the job view: loss and its spread, step time and the slowest
  rank's lag, records per rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from probes.kernel.diagnosis import Alert, Thresholds
from probes.kernel.diagnosis.book import AlertEntry
from probes.kernel.diagnosis.job import JobDiagnoser, RankProgress
from probes.kernel.diagnosis.views import StepView
from tui.run import RunState


@dataclass
class RankSummary:
    """One rank's line in the job view."""

    rank: int
    run_id: str
    host: str
    step: int
    loss: float | None
    steps_per_s: float | None
    lag: int  # steps behind the job's furthest rank
    records: int
    connected: bool
    quiet_s: float


@dataclass
class JobState:
    """The ranks of one job and what is known across them."""

    job_id: str
    name: str
    world_size: int
    thresholds: Thresholds = field(default_factory=Thresholds)
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> its run's id
    diagnoser: JobDiagnoser = field(init=False)

    def __post_init__(self) -> None:
        self.diagnoser = JobDiagnoser(self.world_size, self.thresholds)

    @property
    def incidents(self) -> list[Alert]:
        """The job's incidents, found across its ranks."""
        return self.diagnoser.incidents

    @property
    def entries(self) -> list[AlertEntry]:
        """Each incident's entry, shared by every rank's alerts."""
        return self.diagnoser.entries

    def add_rank(self, run: RunState) -> None:
        """A rank said hello (again)."""
        self.ranks[run.rank] = run.run_id
        self.diagnoser.start(tuple(run.layers), run.info.sync)

    def rank_runs(self, runs: dict[str, RunState]) -> Iterator[RunState]:
        """The job's runs, by rank."""
        for rank in sorted(self.ranks):
            run = runs.get(self.ranks[rank])
            if run is not None:
                yield run

    # --- records and alerts, by run (the diagnoser's, by rank) ---------------------------

    def observe_step(
        self, run: RunState, view: StepView, runs: dict[str, RunState]
    ) -> list[tuple[RunState, Alert]]:
        """A rank's step record (as its diagnosis read it): the job incidents it newly
        shows (cross-rank checks), each with the run of the rank it names (else this)."""
        return [
            (self._named_run(incident, runs) or run, incident)
            for incident in self.diagnoser.observe_step(run.rank, view)
        ]

    def hold(self, run: RunState, alerts: list[Alert]) -> None:
        """A rank's own alerts wait until every connected rank has reported their step."""
        self.diagnoser.hold(run.rank, alerts, time.monotonic())

    def withdraw(self, rank: int, key: str) -> None:
        """A rank's held alert is over before it was released: it is not raised."""
        self.diagnoser.withdraw(rank, key)

    def raised_by(self, rank: int, key: str) -> bool:
        """True if ``rank``'s alert of ``key`` was raised for the job."""
        return self.diagnoser.raised_by(rank, key)

    def rank_gone(
        self, run: RunState, clean: bool, runs: dict[str, RunState]
    ) -> list[tuple[RunState, Alert]]:
        """A rank's connection ended: without a clean end while other ranks are still
        there, it stalled the job (once per job)."""
        others = {
            r.rank: r.last_step for r in self.rank_runs(runs) if r.connected and r.rank != run.rank
        }
        incident = self.diagnoser.rank_gone(
            run.rank,
            last_step=run.last_step,
            clean=clean,
            reason=run.end_reason or run.disconnect_reason or "connection lost",
            others=others,
        )
        return [] if incident is None else [(run, incident)]

    def quiet_ranks(self, runs: dict[str, RunState], now: float) -> list[tuple[RunState, Alert]]:
        """A rank quiet for ``rank_stall_s`` while another went on past it has stalled."""
        live = [r for r in self.rank_runs(runs) if r.connected]
        found = self.diagnoser.quiet_ranks(
            [RankProgress(r.rank, r.last_step, r.last_frame_at) for r in live], now
        )
        if found is None:
            return []
        rank, incident = found
        return [(next(r for r in live if r.rank == rank), incident)]

    def release(
        self, runs: dict[str, RunState], now: float, *, force: bool = False
    ) -> tuple[list[tuple[RunState, Alert]], list[tuple[RunState, Alert, str]]]:
        """The held alerts whose step every connected rank has reported (or that waited,
        or all with ``force``): those to raise, each naming the ranks that raised it, and
        those folded under a job incident (with its kind)."""
        if not self.diagnoser.holding:  # nearly every record: nothing waits
            return [], []
        complete = min((r.last_step for r in self.rank_runs(runs) if r.connected), default=None)
        released = self.diagnoser.release(complete, now, self.ranks, force=force)
        raised = [
            (run, alert)
            for rank, alert in released.raised
            if (run := runs.get(self.ranks.get(rank, ""))) is not None
        ]
        folded = [
            (run, alert, under)
            for rank, alert, under in released.folded
            if (run := runs.get(self.ranks.get(rank, ""))) is not None
        ]
        return raised, folded

    def _named_run(self, alert: Alert, runs: dict[str, RunState]) -> RunState | None:
        rank = alert.evidence.get("rank")
        if isinstance(rank, int) and rank in self.ranks:
            return runs.get(self.ranks[rank])
        return None

    # --- the job view -------------------------------------------------------------------

    def summary(self, runs: dict[str, RunState], now: float) -> list[RankSummary]:
        """Per rank: host, step, loss, speed, lag behind the furthest rank, records."""
        members = list(self.rank_runs(runs))
        furthest = max((r.last_step for r in members), default=0)
        return [
            RankSummary(
                r.rank,
                r.run_id,
                "?" if r.info.host is None else r.info.host,
                r.last_step,
                r.loss,
                r.steps_per_s,
                furthest - r.last_step,
                r.step_records,
                r.connected,
                now - r.last_frame_at,
            )
            for r in members
        ]

    def loss_spread(self, runs: dict[str, RunState]) -> tuple[float, float] | None:
        """The ranks' latest losses: their median and (max - min)."""
        losses = [r.loss for r in self.rank_runs(runs) if r.loss is not None]
        if len(losses) < 2:
            return None
        return statistics.median(losses), max(losses) - min(losses)
