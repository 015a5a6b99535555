"""The ranks of one distributed job, as one job in the monitor (pure: no widgets, no I/O).

Each rank is a run of its own (``RunState``: its own curves, layer table and
diagnosis). ``JobState`` sees them together:

- cross-rank checks (``probes.kernel.diagnosis.ranks``) over every rank's step records;
- one alert per root cause across ranks: a rank's alert waits until every connected rank
  has reported its step, so that the ranks raising the same alert (an explosion in
  all-reduced gradients shows on all) become one alert naming them all, and an alert
  that is a consequence of a job incident (the explosion after one rank's bad shard)
  folds under it instead of being raised;
- per-rank numbers for the job view: loss and its spread, step time and the slowest
  rank's lag, records per rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from probes.kernel.diagnosis import Alert, Thresholds
from probes.kernel.diagnosis.ranks import JobChecks
from probes.kernel.diagnosis.views import StepView
from tui.run import AlertEntry, RunState

CROSS_RANK_KINDS = frozenset(
    {"rank_outlier", "grads_not_synced", "replicas_diverged", "rank_stalled"}
)
#: What the per-layer rules raise (``probes.kernel.diagnosis.diagnoser.LAYER_RULES``).
SHARED_KINDS = frozenset(
    {
        "exploding_gradient",
        "vanishing_gradient",
        "none_gradients",
        "dead_activations",
        "saturated_activations",
        "grad_not_cleared",
        "updates_not_applied",
        "update_ratio",
    }
)
JOIN_STEPS = 5  # the same alert on two ranks this close is one alert
HOLD_S = 2.0  # a rank's alert waits at most this long for the others to report its step

# What an incident across ranks explains when it comes first: a bad shard's loss makes
# the (all-reduced) gradients explode and the loss spike everywhere; drifting replicas
# make the ranks' losses and gradients differ.
JOB_CONSEQUENCES: dict[str, frozenset[str]] = {
    "rank_outlier": frozenset(
        {
            "exploding_gradient",
            "non_finite",
            "loss_spike",
            "flat_loss",
            "overfitting_signal",
            "update_ratio",
            "guard_skipped_update",
            "skipped_updates",
            "vanishing_gradient",
            "dead_activations",
            "saturated_activations",
        }
    ),
    "grads_not_synced": frozenset({"replicas_diverged", "loss_spike"}),
    "replicas_diverged": frozenset({"loss_spike"}),
}


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
    checks: JobChecks | None = None
    incidents: list[Alert] = field(default_factory=list)  # raised across ranks
    # Each incident's entry, shared by every rank's alerts (a fold updates it for all).
    entries: list[AlertEntry] = field(default_factory=list)
    _surfaced: list[tuple[Alert, int]] = field(default_factory=list)  # (alert, rank)
    _held: list[tuple[int, Alert, float]] = field(default_factory=list)  # (rank, alert, t)

    def add_rank(self, run: RunState) -> None:
        """A rank said hello (again)."""
        self.ranks[run.rank] = run.run_id
        if self.checks is None:
            self.checks = JobChecks(
                tuple(run.layers), str(run.meta.get("sync") or "unknown"), self.thresholds
            )

    def rank_runs(self, runs: dict[str, RunState]) -> Iterator[RunState]:
        """The job's runs, by rank."""
        for rank in sorted(self.ranks):
            run = runs.get(self.ranks[rank])
            if run is not None:
                yield run

    # --- records and alerts --------------------------------------------------------------

    def observe_step(
        self, run: RunState, view: StepView, runs: dict[str, RunState]
    ) -> list[tuple[RunState, Alert]]:
        """A rank's step record (as its diagnosis read it): the job incidents it newly
        shows (cross-rank checks), each with the run of the rank it names (else this)."""
        if self.checks is None:
            return []
        return [
            (self._named_run(incident, runs) or run, self._incident(incident))
            for incident in self.checks.observe(run.rank, view)
        ]

    def hold(self, run: RunState, alerts: list[Alert]) -> None:
        """A rank's own alerts wait until every connected rank has reported their step."""
        now = time.monotonic()
        self._held += [(run.rank, alert, now) for alert in alerts]

    def withdraw(self, rank: int, key: str) -> None:
        """A rank's held alert is over before it was released: it is not raised."""
        self._held = [h for h in self._held if not (h[0] == rank and h[1].key == key)]

    def rank_gone(
        self, run: RunState, clean: bool, runs: dict[str, RunState]
    ) -> list[tuple[RunState, Alert]]:
        """A rank's connection ended: without a clean end while other ranks are still
        there, it stalled the job (once per job)."""
        others = {
            r.rank: r.last_step for r in self.rank_runs(runs) if r.connected and r.rank != run.rank
        }
        if clean or self.checks is None:
            return []
        reason = run.end_reason or run.disconnect_reason or "connection lost"
        incident = self.checks.stalled(
            run.rank, last_step=run.last_step, reason=reason, others=others
        )
        return [] if incident is None else [(run, self._incident(incident))]

    def quiet_ranks(self, runs: dict[str, RunState], now: float) -> list[tuple[RunState, Alert]]:
        """A rank quiet for ``rank_stall_s`` while another went on past it has stalled."""
        live = [r for r in self.rank_runs(runs) if r.connected]
        if self.checks is None or len(live) < 2:
            return []
        for run in live:
            quiet = now - run.last_frame_at
            ahead = {
                r.rank: r.last_step
                for r in live
                if r.rank != run.rank
                and r.last_step > run.last_step
                and now - r.last_frame_at < quiet
            }
            if quiet > self.thresholds.rank_stall_s and ahead:
                incident = self.checks.stalled(
                    run.rank,
                    last_step=run.last_step,
                    reason=f"quiet for {quiet:.0f} s",
                    others=ahead,
                )
                if incident is not None:
                    return [(run, self._incident(incident))]
        return []

    def release(
        self, runs: dict[str, RunState], now: float, *, force: bool = False
    ) -> tuple[list[tuple[RunState, Alert]], list[tuple[int, Alert]]]:
        """The held alerts whose step every connected rank has reported (or that waited
        ``HOLD_S``, or all with ``force``): those to raise, each naming the ranks that
        raised it, and those folded under a job incident (rank, alert). An alert
        another rank raised already is joined to it, neither raised nor folded."""
        if not self._held:  # nearly every record: nothing waits
            return [], []
        complete = min((r.last_step for r in self.rank_runs(runs) if r.connected), default=None)
        ready = [
            h
            for h in self._held
            if force or complete is None or h[1].step <= complete or now - h[2] > HOLD_S
        ]
        if not ready:
            return [], []
        self._held = [h for h in self._held if h not in ready]
        raised: list[tuple[RunState, Alert]] = []
        folded: list[tuple[int, Alert]] = []
        for rank, alert, _ in ready:
            if self._fold(alert):
                folded.append((rank, alert))
                continue
            if self._join(alert, rank):
                continue
            same = {
                r
                for r, a, _ in ready
                if a.key == alert.key and abs(a.step - alert.step) <= JOIN_STEPS
            }
            if self._shared(alert):  # rank 0 speaks for the all-reduced gradients
                same = set(self.ranks)
            labelled = replace(
                alert, ranks=tuple(sorted(same | {rank})), world_size=self.world_size
            )
            self._surfaced.append((labelled, rank))
            run = runs.get(self.ranks.get(rank, ""))
            if run is not None:
                raised.append((run, labelled))
        return raised, folded

    def raised_by(self, rank: int, key: str) -> bool:
        """True if ``rank``'s alert of ``key`` was raised for the job (so its clearing
        is news, where a joined or folded one's is not)."""
        return any(a.key == key and r == rank for a, r in self._surfaced)

    def _fold(self, alert: Alert) -> bool:
        """Fold ``alert`` under the job incident it is a consequence of, if any."""
        for index, incident in enumerate(self.incidents):
            if alert.kind in JOB_CONSEQUENCES.get(incident.kind, ()) and (
                alert.step >= incident.step - JOIN_STEPS
            ):
                name = f"{alert.kind}@{alert.step}"
                if name not in incident.folded:
                    self.incidents[index] = self.entries[index].alert = incident.with_folded(name)
                return True
        return False

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

    def _shared(self, alert: Alert) -> bool:
        """Under DDP the per-layer rules run on rank 0 alone (every rank holds the same
        gradients and weights): what they find holds for all ranks."""
        return self.checks is not None and self.checks.sync == "ddp" and alert.kind in SHARED_KINDS

    @staticmethod
    def is_incident(alert: Alert) -> bool:
        """True for the job's own alerts (found across ranks)."""
        return alert.kind in CROSS_RANK_KINDS

    def _incident(self, alert: Alert) -> Alert:
        labelled = replace(alert, world_size=self.world_size)
        self.incidents.append(labelled)
        self.entries.append(AlertEntry(labelled))
        return labelled

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
                str(r.meta.get("host", "?")),
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
