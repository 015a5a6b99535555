"""The ranks of one distributed job, as one job in the monitor (pure: no widgets, no I/O).

Each rank is a run of its own (``RunState``: its own curves, layer table and alert
book). ``JobState`` sees them together:

- its ``diagnoser`` (``probes.kernel.diagnosis.job``): the cross-rank checks over every
  rank's step records, and one alert per root cause across ranks (a rank's alert waits
  for every rank's record of its step, then is joined or folded under the job's
  incident); ``JobState`` tells it which runs are its ranks and how far each has come;
- per-rank numbers for the job view: loss and its spread, step time and the slowest
  rank's lag, records per rank, the straggler score (data wait plus forward a step);
  for a job of more ranks than the view has lines (``ranks_view``), the ranks that
  stand out first (gone, quiet, a loss apart from the others', behind the others, a
  straggler) and the rest summarised in one line.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from probes.kernel.diagnosis import Alert, Thresholds
from probes.kernel.diagnosis.book import AlertEntry
from probes.kernel.diagnosis.diagnoser import REPLICA_KINDS
from probes.kernel.diagnosis.job import JobDiagnoser, RankProgress
from probes.kernel.diagnosis.views import StepView
from probes.kernel.endings import CONNECTION_LOST
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
    # its mean data wait plus forward seconds a step, recently (None: not measured)
    straggle: float | None = None


#: Ranks listed one a line; a job of more shows those that stand out and a summary.
LISTED_RANKS = 16
QUIET_S = 10.0  # a connected rank silent this long is shown as quiet
# A rank's loss stands out when it is this many interquartile ranges outside the
# others' quartiles, and this share of their median away from it (a job whose ranks
# agree closely has a tiny range: a rounding is not an outlier).
LOSS_IQRS = 3.0
LOSS_SHARE = 0.05
# A rank is behind when its step is this many interquartile ranges below the ranks'
# first quartile, and at least this many steps (a thinned record shows its span's last
# step: a rank sending 10 records a second is seen a few steps behind in passing).
LAG_IQRS = 1.5
LAG_MIN_STEPS = 3


@dataclass(frozen=True)
class RestSummary:
    """The ranks not listed in the job view, in one line."""

    count: int
    steps: tuple[int, int]  # the lowest and highest step among them
    loss: tuple[float, float, float] | None  # median, lowest, highest (finite ones)
    steps_per_s: float | None  # their median speed
    lag: int  # the most any of them lags the job's furthest rank
    records: int  # records they sent, together


@dataclass(frozen=True)
class RanksView:
    """What the job view lists: each listed rank with why (``""``: a small job lists
    every rank, in rank order), and the others summarised (None: every rank is listed)."""

    listed: list[tuple[RankSummary, str]]
    rest: RestSummary | None


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
        self.diagnoser.start(tuple(run.layers), run.info.sync, rank=run.rank, host=run.info.host)

    def has_live_rank(self, runs: dict[str, RunState]) -> bool:
        """Is any of the job's ranks still connected? (Read at every close: asks the
        ranks in turn, and stops at the first connected one. Ranks closing in the order
        they connected make each close ask every rank gone before it: 145 ms for all
        1,024, where a random order takes 20.)"""
        return any(run.connected for run in map(runs.get, self.ranks.values()) if run)

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
        found = self.diagnoser.observe_step(run.rank, view)
        if found:  # (rare: rank 0's causes are looked up only then)
            self.diagnoser.fold_explained(found, self._replica_causes(runs))
        return [(self._named_run(incident, runs) or run, incident) for incident in found]

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

        def others() -> dict[int, int]:  # (asked only while this end can stall the job)
            return {
                r.rank: r.last_step
                for r in self.rank_runs(runs)
                if r.connected and r.rank != run.rank
            }

        incident = self.diagnoser.rank_gone(
            run.rank,
            last_step=run.last_step,
            clean=clean,
            reason=run.end_reason or run.disconnect_reason or CONNECTION_LOST,
            others=others,
            now=time.monotonic(),
        )
        return [] if incident is None else [(self._named_run(incident, runs) or run, incident)]

    def stall_due(
        self, runs: dict[str, RunState], now: float, *, force: bool = False
    ) -> list[tuple[RunState, Alert]]:
        """A rank gone with an error that no other rank shared in time stalled the job."""
        incident = self.diagnoser.stall_due(now, force=force)
        if incident is None:
            return []
        named = self._named_run(incident, runs)
        return [] if named is None else [(named, incident)]

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
        released = self.diagnoser.release(
            complete, now, self.ranks, force=force, replica_causes=self._replica_causes(runs)
        )
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

    def _replica_causes(self, runs: dict[str, RunState]) -> dict[str, Alert]:
        """Rank 0's live causes of the kinds it finds for every replica (DDP)."""
        first = runs.get(self.ranks.get(0, ""))
        if first is None:
            return {}
        causes = first.diagnoser.live_causes()
        return {kind: alert for kind, alert in causes.items() if kind in REPLICA_KINDS}

    def _named_run(self, alert: Alert, runs: dict[str, RunState]) -> RunState | None:
        rank = alert.evidence.get("rank")
        if isinstance(rank, int) and rank in self.ranks:
            return runs.get(self.ranks[rank])
        return None

    # --- the job view -------------------------------------------------------------------

    def summary(self, runs: dict[str, RunState], now: float) -> list[RankSummary]:
        """Per rank: host, step, loss, speed, lag behind the furthest rank, records, and
        its straggler score (``RunResources.straggle``)."""
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
                r.resources.straggle(),
            )
            for r in members
        ]

    def loss_spread(self, runs: dict[str, RunState]) -> tuple[float, float] | None:
        """The ranks' latest losses: their median and (max - min)."""
        losses = [r.loss for r in self.rank_runs(runs) if r.loss is not None]
        if len(losses) < 2:
            return None
        return statistics.median(losses), max(losses) - min(losses)


def ranks_view(lines: list[RankSummary], selected: str | None = None) -> RanksView:
    """The job view's lines from the ranks' (``JobState.summary``, by rank): every rank
    for a job of up to ``LISTED_RANKS`` (by straggler score, highest first, where the
    ranks measure it: ``by_straggle``); for a larger one the ranks that stand out, the
    worst first (gone, quiet, a loss apart, behind, a straggler), then the rank the
    views show (``selected``, a run id) and rank 0, each with why it is listed, and the
    others summarised."""
    if len(lines) <= LISTED_RANKS:
        return RanksView([(line, "") for line in by_straggle(lines)], None)
    reasons = _standing_out(lines)
    notable = sorted(
        (line for line in lines if line.rank in reasons),
        key=lambda line: (_WORST_FIRST.index(reasons[line.rank][0]), -reasons[line.rank][1]),
    )
    listed = [(line, reasons[line.rank][0]) for line in notable[: LISTED_RANKS - 2]]
    for line in lines:  # the rank the views show, and rank 0, always have their line
        if (line.run_id == selected or line.rank == 0) and all(
            line is not shown for shown, _ in listed
        ):
            listed.append((line, "shown" if line.run_id == selected else "rank 0"))
    kept = {id(line) for line, _ in listed}
    rest = [line for line in lines if id(line) not in kept]
    return RanksView(listed, _summarised(rest) if rest else None)


# Why a rank is listed, the worst first.
_WORST_FIRST = ("gone", "quiet", "loss", "behind", "straggler")
# A rank is a straggler when its score (``RankSummary.straggle``) is this many
# interquartile ranges above the ranks' third quartile, and this share above their median.
STRAGGLE_IQRS = 3.0
STRAGGLE_SHARE = 0.2


def by_straggle(lines: list[RankSummary]) -> list[RankSummary]:
    """The ranks by straggler score, highest first (those not measured last, by rank):
    the rank the others wait for at each all-reduce comes first."""
    return sorted(
        lines, key=lambda line: (line.straggle is None, -(line.straggle or 0.0), line.rank)
    )


def _standing_out(lines: list[RankSummary]) -> dict[int, tuple[str, float]]:
    """Rank -> (why it stands out, how far: larger first), for the ranks that do."""
    out: dict[int, tuple[str, float]] = {}
    live = [line for line in lines if line.connected]
    losses = [line.loss for line in live if line.loss is not None and math.isfinite(line.loss)]
    loss_band = _band(losses, LOSS_IQRS)
    step_band = _band([float(line.step) for line in live], LAG_IQRS)
    scores = [line.straggle for line in live if line.straggle is not None]
    straggle_band = _band(scores, STRAGGLE_IQRS)
    for line in lines:
        if not line.connected:
            out[line.rank] = ("gone", line.lag)
        elif line.quiet_s >= QUIET_S:
            out[line.rank] = ("quiet", line.quiet_s)
        elif line.loss is not None and not math.isfinite(line.loss):
            out[line.rank] = ("loss", math.inf)
        elif line.loss is not None and loss_band is not None:
            low, high, median = loss_band
            distance = abs(line.loss - median)
            if (line.loss < low or line.loss > high) and distance > LOSS_SHARE * abs(median):
                out[line.rank] = ("loss", distance)
        if line.rank not in out and step_band is not None and line.connected:
            low, _, median = step_band
            if line.step < low and median - line.step >= LAG_MIN_STEPS:
                out[line.rank] = ("behind", line.lag)
        score = line.straggle
        if line.rank not in out and straggle_band is not None and score is not None:
            _, high, median = straggle_band
            if line.connected and score > high and score > (1 + STRAGGLE_SHARE) * median:
                out[line.rank] = ("straggler", score)
    return out


def _band(values: Sequence[float], iqrs: float) -> tuple[float, float, float] | None:
    """(lowest, highest) values not standing out (``iqrs`` interquartile ranges outside
    the quartiles), and the median; None for fewer than four values."""
    if len(values) < 4:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4)
    spread = iqrs * (q3 - q1)
    return q1 - spread, q3 + spread, median


def _summarised(lines: list[RankSummary]) -> RestSummary:
    losses = sorted(x.loss for x in lines if x.loss is not None and math.isfinite(x.loss))
    speeds = [x.steps_per_s for x in lines if x.steps_per_s is not None]
    return RestSummary(
        count=len(lines),
        steps=(min(x.step for x in lines), max(x.step for x in lines)),
        loss=(statistics.median(losses), losses[0], losses[-1]) if losses else None,
        steps_per_s=statistics.median(speeds) if speeds else None,
        lag=max(x.lag for x in lines),
        records=sum(x.records for x in lines),
    )
