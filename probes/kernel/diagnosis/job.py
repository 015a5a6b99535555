"""The job-level diagnoser: the cross-rank rules of one job and what its incidents do to
the alerts of its ranks (pure Python, no I/O; the monitor feeds it, keyed by rank).

Each rank has its own diagnosis (``Diagnoser``, in its ``AlertBook``). ``JobDiagnoser``
sees them together:

- the cross-rank checks (``ranks.JobChecks``) over every rank's step records, and the
  stalls (a rank gone without a clean end, or quiet while another went on);
- in a data-parallel job, the straggler (``straggler.Stragglers``): the rank the others
  wait for, held while its gap lasts; its incident's entry clears (for every rank's
  book, which shares it) when the gap ends;
- one alert per root cause across ranks: a rank's alert is held until every connected
  rank has reported its step, then the ranks raising the same alert (an explosion in
  all-reduced gradients shows on all) become one alert naming them all, and an alert
  that is a consequence of a job incident (``incidents.JOB_CONSEQUENCES``: the explosion
  after one rank's bad shard) folds under it instead of being raised;
- under DDP, the rules over what every replica holds alike run on rank 0 alone
  (``diagnoser.REPLICA_RULES``): what they find holds for every rank, and another
  rank's own alert that is a consequence of it (a loss that diverged after the
  all-reduced gradients exploded) folds under it, as it does on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from probes.kernel.diagnosis.alert import Alert
from probes.kernel.diagnosis.book import AlertEntry
from probes.kernel.diagnosis.diagnoser import REPLICA_KINDS
from probes.kernel.diagnosis.incidents import (
    JOB_CONSEQUENCES,
    cause_for,
    explains_on_rank,
    folded_name,
    lists_kind,
    replica_cause,
)
from probes.kernel.diagnosis.ranks import DATA_PARALLEL, JobChecks
from probes.kernel.diagnosis.straggler import Stragglers
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import StepView
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.endings import ERROR_PREFIX

JOIN_STEPS = 5  # the same alert on two ranks this close is one alert
HOLD_S = 2.0  # a rank's alert waits at most this long for the others to report its step


class RankProgress(NamedTuple):
    """How far a connected rank has come, and when it was last heard from."""

    rank: int
    last_step: int
    last_frame_at: float  # time.monotonic()


class GoneRank(NamedTuple):
    """A rank whose connection ended without a clean end, as it was then."""

    rank: int
    last_step: int
    reason: str
    others: Mapping[int, int]  # the ranks still there: rank -> last step
    at: float  # time.monotonic()


class Released(NamedTuple):
    """The held alerts let go: those to raise (rank, alert naming the ranks that raised
    it), and those folded under a job incident (rank, alert, the incident's kind)."""

    raised: list[tuple[int, Alert]]
    folded: list[tuple[int, Alert, str]]


@dataclass
class JobDiagnoser:
    """The cross-rank diagnosis of one job of ``world_size`` ranks.

    Args:
        world_size: how many ranks the job has (alerts name theirs among them).
        thresholds: the ``rank_*`` thresholds and the spike rule's minimal jump.
    """

    world_size: int
    thresholds: Thresholds = field(default_factory=Thresholds)
    checks: JobChecks | None = None  # from the first rank's hello (``start``)
    stragglers: Stragglers | None = None  # ... a data-parallel job's
    incidents: list[Alert] = field(default_factory=list)  # raised across ranks
    # Each incident's entry, shared by every rank's book (a fold updates it for all).
    entries: list[AlertEntry] = field(default_factory=list)
    _surfaced: list[tuple[Alert, int]] = field(default_factory=list)  # (alert, rank)
    _held: list[tuple[int, Alert, float]] = field(default_factory=list)  # (rank, alert, t)
    _gone_with_error: GoneRank | None = None  # held: did the others fail the same way?
    _failed_together: bool = False  # two ranks ended with one error: the job's code

    def start(
        self,
        layers: tuple[str, ...],
        sync: str,
        *,
        rank: int | None = None,
        host: str | None = None,
    ) -> None:
        """A rank said hello: the layers and how gradients are shared (the first one's
        are the job's), its rank and its host (the straggler alert names it)."""
        if self.checks is None:
            self.checks = JobChecks(layers, sync, self.thresholds)
            if sync in DATA_PARALLEL:
                self.stragglers = Stragglers(self.thresholds)
        if self.stragglers is not None and rank is not None:
            self.stragglers.meet(rank, host)

    # --- the cross-rank rules ------------------------------------------------------------

    def observe_step(self, rank: int, view: StepView) -> list[Alert]:
        """Rank ``rank``'s step record (as its diagnosis read it): the job incidents it
        newly shows."""
        if self.checks is None:
            return []
        found = [self._incident(found) for found in self.checks.observe(rank, view)]
        if self.stragglers is not None:
            straggler, ended = self.stragglers.observe(rank, view)
            if ended is not None:
                self._end(ended, view.step)
            if straggler is not None:
                found.append(self._incident(straggler))
        return found

    def _end(self, incident: Alert, step: int) -> None:
        """A held incident's condition ended (a straggler's gap): its entry, which every
        rank's book shares, is cleared at ``step``."""
        for entry in reversed(self.entries):
            if entry.active and entry.alert.kind == incident.kind:
                entry.active = False
                entry.cleared_at = step
                return

    def fold_explained(self, incidents: list[Alert], replica_causes: Mapping[str, Alert]) -> None:
        """Of ``incidents`` just found, those a cause of rank 0's for every replica
        explains (a rank's loss apart while the rate is far too high:
        ``incidents.REPLICA_EXPLAINS``; ``replica_causes`` as for ``release``) are kept
        folded under it: their entries' ``folded_under`` says so; they are not raised."""
        if not self._replicated():
            return
        for incident in incidents:
            cause = replica_cause(incident, replica_causes)
            if cause is not None:
                self.entry_of(incident).folded_under = cause.kind

    def entry_of(self, incident: Alert) -> AlertEntry:
        """The entry of an incident this job raised (``observe_step``, ``rank_gone``,
        ``quiet_ranks``), shared by its ranks' books."""
        return next(e for e in reversed(self.entries) if e.alert is incident)

    def rank_gone(
        self,
        rank: int,
        *,
        last_step: int,
        clean: bool,
        reason: str,
        others: Callable[[], Mapping[int, int]],
        now: float = 0.0,
    ) -> Alert | None:
        """Rank ``rank``'s connection ended (``reason``) at ``now``: without a clean end
        while ``others()`` (rank -> last step) are still there, it stalled the job (once).
        ``others`` is asked only while this end can still stall the job: at the end of a
        1,024-rank job, making that map for every close took the monitor 0.4 s.

        A rank that ended with an error is held ``HOLD_S`` first (``stall_due``): when
        another rank ends with the same error, the job's code failed on every rank (a
        shape bug, a bad config), no one rank stalled it, and no stall is raised for it.
        Another rank gone otherwise meanwhile raises the held one's at once."""
        if (
            clean
            or self.checks is None
            or self._failed_together
            or AlertKind.RANK_STALLED in self.checks.found  # (raised once a job)
        ):
            return None  # (a rank held with an error stays held: stall_due raises nothing)
        held, self._gone_with_error = self._gone_with_error, None
        if held is not None:
            if reason == held.reason:
                self._failed_together = True
                return None
            return self._stall(held)
        gone = GoneRank(rank, last_step, reason, dict(others()), now)
        if reason.startswith(ERROR_PREFIX) and gone.others:
            self._gone_with_error = gone
            return None
        return self._stall(gone)

    def stall_due(self, now: float, *, force: bool = False) -> Alert | None:
        """The held rank gone with an error (``rank_gone``), once ``HOLD_S`` has passed
        with no other rank ending the same way (or at once with ``force``)."""
        held = self._gone_with_error
        if held is None or not (force or now - held.at > HOLD_S):
            return None
        self._gone_with_error = None
        return self._stall(held)

    def _stall(self, gone: GoneRank) -> Alert | None:
        assert self.checks is not None
        found = self.checks.stalled(
            gone.rank, last_step=gone.last_step, reason=gone.reason, others=gone.others
        )
        return None if found is None else self._incident(found)

    def quiet_ranks(self, live: list[RankProgress], now: float) -> tuple[int, Alert] | None:
        """A connected rank quiet for ``rank_stall_s`` while another went on past it has
        stalled: that rank and the incident."""
        if self.checks is None or len(live) < 2 or AlertKind.RANK_STALLED in self.checks.found:
            return None  # (one stall per job: once found, none is looked for)
        ahead = _furthest_heard_since(live)
        for rank in live:
            quiet = now - rank.last_frame_at
            further = ahead.get(rank.rank)
            if quiet <= self.thresholds.rank_stall_s or further is None:
                continue
            if further[1] > rank.last_step:
                found = self.checks.stalled(
                    rank.rank,
                    last_step=rank.last_step,
                    reason=f"quiet for {quiet:.0f} s",
                    others={further[0]: further[1]},
                )
                if found is not None:
                    return rank.rank, self._incident(found)
        return None

    # --- the ranks' own alerts -----------------------------------------------------------

    def hold(self, rank: int, alerts: list[Alert], now: float) -> None:
        """A rank's own alerts wait until every connected rank has reported their step."""
        self._held += [(rank, alert, now) for alert in alerts]

    @property
    def holding(self) -> bool:
        """True while some rank's alert waits (nearly every record: none does)."""
        return bool(self._held)

    def withdraw(self, rank: int, key: str) -> None:
        """A rank's held alert is over before it was released: it is not raised."""
        self._held = [h for h in self._held if not (h[0] == rank and h[1].key == key)]

    def release(
        self,
        complete: int | None,
        now: float,
        ranks: Collection[int],
        *,
        force: bool = False,
        replica_causes: Mapping[str, Alert] | None = None,
    ) -> Released:
        """The held alerts whose step every connected rank has reported (``complete``:
        the least of their steps; None: no rank is connected), that waited ``HOLD_S``,
        or all with ``force``. An alert another rank raised already is joined to it,
        neither raised nor folded. ``ranks``: every rank of the job. ``replica_causes``:
        rank 0's live causes (``Diagnoser.live_causes``) that hold for every rank
        (``REPLICA_KINDS``, under DDP): another rank's consequence of one folds under it."""
        ready: list[tuple[int, Alert, float]] = []
        waiting: list[tuple[int, Alert, float]] = []
        for held in self._held:  # (one pass: a thousand ranks may hold the same alert)
            due = force or complete is None or held[1].step <= complete or now - held[2] > HOLD_S
            (ready if due else waiting).append(held)
        released = Released([], [])
        if not ready:
            return released
        self._held = waiting
        for rank, alert, _ in ready:
            under = self._fold(rank, alert)
            if under is not None:
                released.folded.append((rank, alert, under))
                continue
            cause = self._replica_cause(rank, alert, replica_causes or {})
            if cause is not None:
                released.folded.append((rank, alert, cause.kind))
                continue
            if self._join(alert, rank):
                continue
            same = {
                r
                for r, a, _ in ready
                if a.key == alert.key and abs(a.step - alert.step) <= JOIN_STEPS
            }
            if self.speaks_for_every_rank(alert):  # rank 0's, of the all-reduced gradients
                same = set(ranks)
            labelled = replace(
                alert, ranks=tuple(sorted(same | {rank})), world_size=self.world_size
            )
            self._surfaced.append((labelled, rank))
            released.raised.append((rank, labelled))
        return released

    def raised_by(self, rank: int, key: str) -> bool:
        """True if ``rank``'s alert of ``key`` was raised for the job (so its clearing
        is news, where a joined or folded one's is not)."""
        return any(a.key == key and r == rank for a, r in self._surfaced)

    # --- consequences --------------------------------------------------------------------

    def _fold(self, rank: int, alert: Alert) -> str | None:
        """Fold rank ``rank``'s ``alert`` under the job incident it is a consequence of,
        if any (one still holding): that incident's kind."""
        for index, incident in enumerate(self.incidents):
            explains = alert.kind in JOB_CONSEQUENCES.get(incident.kind, ()) or (
                explains_on_rank(incident, rank, alert)
            )
            if explains and self.entries[index].active and alert.step >= incident.step - JOIN_STEPS:
                # listed once a kind, as a run lists its own (the same consequence on
                # several ranks, a step or two apart, read as two)
                if not lists_kind(incident, alert.kind):
                    name = folded_name(alert)
                    self.incidents[index] = self.entries[index].alert = incident.with_folded(name)
                return incident.kind
        return None

    def _replica_cause(self, rank: int, alert: Alert, causes: Mapping[str, Alert]) -> Alert | None:
        """The cause rank 0 found for every replica that ``alert`` (another rank's own)
        is a consequence of, by the rules a run folds by (``incidents.cause_for``)."""
        if rank == 0 or not causes or not self._replicated():
            return None
        return cause_for(alert, causes)

    def _join(self, alert: Alert, rank: int) -> bool:
        """True if another rank already raised this alert (close in steps): the raised
        one now names this rank too."""
        for index, (surfaced, first_rank) in enumerate(self._surfaced):
            if surfaced.key == alert.key and abs(surfaced.step - alert.step) <= JOIN_STEPS:
                if rank not in surfaced.ranks:
                    ranks = tuple(sorted({*surfaced.ranks, rank}))
                    self._surfaced[index] = (replace(surfaced, ranks=ranks), first_rank)
                return first_rank != rank or surfaced.step != alert.step
        return False

    def speaks_for_every_rank(self, alert: Alert) -> bool:
        """Under DDP the replica rules run on rank 0 alone (every rank holds the same
        gradients and weights): what they find holds for all ranks."""
        return self._replicated() and alert.kind in REPLICA_KINDS

    def _replicated(self) -> bool:
        """True for a DDP job: its ranks are replicas of one model."""
        return self.checks is not None and self.checks.sync == "ddp"

    def _incident(self, alert: Alert) -> Alert:
        labelled = replace(alert, world_size=self.world_size)
        self.incidents.append(labelled)
        self.entries.append(AlertEntry(labelled))
        return labelled


def _furthest_heard_since(live: list[RankProgress]) -> dict[int, tuple[int, int]]:
    """Per rank, the rank heard from after it that is furthest on, and its step (absent:
    none was heard after it). One sort, not a pass over the others per rank: a tick
    looks at every rank of a job of a thousand."""
    out: dict[int, tuple[int, int]] = {}
    best: tuple[int, int] | None = None  # (rank, step) furthest among those heard later
    newest_first = sorted(live, key=lambda r: r.last_frame_at, reverse=True)
    index = 0
    while index < len(newest_first):  # ranks heard at the same moment: none is "after"
        moment = newest_first[index].last_frame_at
        same = []
        while index < len(newest_first) and newest_first[index].last_frame_at == moment:
            same.append(newest_first[index])
            index += 1
        if best is not None:
            out.update((r.rank, best) for r in same)
        for r in same:
            if best is None or r.last_step > best[1]:
                best = (r.rank, r.last_step)
    return out
