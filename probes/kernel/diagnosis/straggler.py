"""A job's straggler: the rank the others wait for, and the phase that explains the gap.

The principle: in a data-parallel step every rank's cycle is the same, since the
collective that shares the gradients (DDP's all-reduce, FSDP's reduce-scatter) waits for
the slowest rank before any rank goes on. The straggler's own work before the gradients
are shared (its wait for the batch and its forward) takes longer, and the other ranks
spend that time waiting in their backward, where the collective runs. So each rank's
time before the collective, ``data_time + forward_time`` a step, is compared with the
median of the other ranks' over a window of its recent steps (``straggler_window_steps``,
at least ``straggler_min_records`` records, after ``straggler_warmup_steps``: a run's
first steps load, compile and fill caches, unevenly across ranks). A rank above that
median by ``straggler_gap_share`` of the step or more (ranks that share a host differ by
a few percent: scheduling, caches, their shards' sizes) in most of its window
(``straggler_held_share`` of its steps, not one slow step) is the straggler. The phase
named is the one, data or forward, that explains ``straggler_phase_share`` of the gap;
else ``compute`` (both together). A rank slower only in its backward compute is not found:
its extra time and the others' wait fall in the same phase, which the records do not
split.

One alert for the job (subject ``rank N``), held while the gap lasts and cleared when it
ends (under ``straggler_clear_share`` of the step, or held in under
``straggler_clear_held`` of the window: hysteresis, so a gap about the bound is one
incident). Records without the phases' times (an older probe) are not judged.

Cost: a record is added to its rank's window in O(1) (the window kept as sums); the
ranks are compared once every ``CHECK_EVERY`` steps of the job (a median over the ranks),
not on every record.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import StepView
from probes.kernel.diagnosis.vocabulary import AlertKind

# The ranks are compared once every this many steps of the job (the newest any rank
# reported): a window of 50 steps moves by a fifth between two comparisons.
CHECK_EVERY = 10
# A slow rank costs time, it does not make the training wrong.
SEVERITY = Severity.WARNING
# The phases a gap is put down to.
DATA, FORWARD, COMPUTE = "data", "forward", "compute"


@dataclass(frozen=True, slots=True)
class Timed:
    """One record's times (seconds, summed over the steps it stands for)."""

    first: int
    last: int
    cycle: float
    data: float
    forward: float

    @property
    def steps(self) -> int:
        return self.last - self.first + 1

    @property
    def before_collective(self) -> float:
        """Its time before the gradients are shared, a step."""
        return (self.data + self.forward) / self.steps


@dataclass
class RankWindow:
    """A rank's latest records: at least ``steps`` steps and ``records`` records, kept as
    their sums."""

    records: deque[Timed] = field(default_factory=deque)
    steps: int = 0
    cycle: float = 0.0
    data: float = 0.0
    forward: float = 0.0

    def add(self, timed: Timed, window_steps: int, min_records: int) -> None:
        if self.records and timed.first <= self.records[-1].last:
            return  # (a step already counted: a history replayed after the live records)
        self.records.append(timed)
        self._count(timed, 1)
        while len(self.records) > min_records and self.steps - self.records[0].steps >= (
            window_steps
        ):
            self._count(self.records.popleft(), -1)

    def _count(self, timed: Timed, sign: int) -> None:
        self.steps += sign * timed.steps
        self.cycle += sign * timed.cycle
        self.data += sign * timed.data
        self.forward += sign * timed.forward

    @property
    def newest(self) -> int:
        return self.records[-1].last if self.records else -1

    def per_step(self) -> tuple[float, float, float]:
        """(cycle, data, forward) a step over the window."""
        return self.cycle / self.steps, self.data / self.steps, self.forward / self.steps

    def steps_at_least(self, bound: float) -> int:
        """The window's steps in records whose time before the collective is at least
        ``bound`` a step."""
        return sum(t.steps for t in self.records if t.before_collective >= bound)


@dataclass(frozen=True)
class Gap:
    """How far one rank's time before the collective stands above the other ranks'."""

    rank: int
    cycle: float  # the job's step, seconds (the ranks' median)
    gap: float  # seconds a step, over the others' median
    data_gap: float
    forward_gap: float
    held: float  # the share of its window's steps whose records show the gap
    steps: int  # its window

    @property
    def share(self) -> float:
        return self.gap / self.cycle

    def phase(self, explains: float) -> tuple[str, float]:
        """The phase that explains at least ``explains`` of the gap, and its share; else
        ``compute`` and the share data and forward explain together."""
        data, forward = self.data_gap / self.gap, self.forward_gap / self.gap
        if data >= explains:
            return DATA, data
        if forward >= explains:
            return FORWARD, forward
        return COMPUTE, data + forward


@dataclass
class Stragglers:
    """The straggler check of one data-parallel job: ``observe`` each rank's step
    records; it says when a straggler is found and when its gap ends.

    Args:
        thresholds: the ``straggler_*`` thresholds.
    """

    thresholds: Thresholds = field(default_factory=Thresholds)
    current: Alert | None = None  # the straggler raised and holding
    _rank: int = -1  # ... its rank
    _hosts: dict[int, str] = field(default_factory=dict)
    _windows: dict[int, RankWindow] = field(default_factory=dict)
    _newest: int = -1  # the newest step any rank reported
    _next_check: int = 0

    def meet(self, rank: int, host: str | None) -> None:
        """A rank's hello named its host (the alert names the straggler's)."""
        if host:
            self._hosts[rank] = host

    def observe(self, rank: int, view: StepView) -> tuple[Alert | None, Alert | None]:
        """Rank ``rank``'s step record: the straggler newly found (else None), and the
        one whose gap ended (else None)."""
        timed = self._timed(view)
        if timed is not None:
            limits = self.thresholds
            window = self._windows.setdefault(rank, RankWindow())
            window.add(timed, limits.straggler_window_steps, limits.straggler_min_records)
        self._newest = max(self._newest, view.step)
        if view.step < self._next_check:
            return None, None  # (nearly every record)
        self._next_check = view.step + CHECK_EVERY
        return self._judge(view.step)

    def _timed(self, view: StepView) -> Timed | None:
        """The record's times, if it has them and is past the warm-up."""
        cycle, data, forward = view.cycle, view.data_time, view.forward_time
        if cycle is None or data is None or forward is None:
            return None  # (an older probe: no phases)
        if view.first < self.thresholds.straggler_warmup_steps or cycle <= 0:
            return None
        return Timed(view.first, view.step, cycle, data, forward)

    def _judge(self, step: int) -> tuple[Alert | None, Alert | None]:
        """Compare the ranks: hold, end or raise the straggler."""
        ready = self._ready()
        limits = self.thresholds
        ended = None
        if self.current is not None:
            rank = self._rank
            held = self._gap(rank, ready) if rank in ready and len(ready) > 1 else None
            if (
                held is not None
                and held.share >= limits.straggler_clear_share
                and held.held >= limits.straggler_clear_held
            ):
                return None, None  # (it lasts)
            ended, self.current = self.current, None
        if len(ready) < 2:
            return None, ended
        suspect = max(ready, key=lambda r: _before_collective(ready[r]))
        found = self._gap(suspect, ready)
        if found.share < limits.straggler_gap_share or found.held < limits.straggler_held_share:
            return None, ended
        self.current, self._rank = self._alert(step, found), found.rank
        return self.current, ended

    def _ready(self) -> dict[int, RankWindow]:
        """The ranks whose window is full and recent (a rank that stopped sending is not
        compared: its window is the past, and ``rank_stalled`` is its alert)."""
        limits = self.thresholds
        return {
            rank: window
            for rank, window in self._windows.items()
            if window.steps >= limits.straggler_window_steps
            and len(window.records) >= limits.straggler_min_records
            and window.newest >= self._newest - window.steps
        }

    def _gap(self, rank: int, ready: dict[int, RankWindow]) -> Gap:
        """Rank ``rank``'s time before the collective against the others' median (and
        each phase's against the others' median of it)."""
        own_cycle, own_data, own_forward = ready[rank].per_step()
        others = [w.per_step() for r, w in ready.items() if r != rank]
        cycle = statistics.median([own_cycle, *(o[0] for o in others)])
        before = statistics.median(o[1] + o[2] for o in others)
        bound = before + self.thresholds.straggler_gap_share * cycle
        own = ready[rank]
        return Gap(
            rank,
            cycle,
            own_data + own_forward - before,
            own_data - statistics.median(o[1] for o in others),
            own_forward - statistics.median(o[2] for o in others),
            own.steps_at_least(bound) / own.steps,
            own.steps,
        )

    def _alert(self, step: int, found: Gap) -> Alert:
        phase, phase_share = found.phase(self.thresholds.straggler_phase_share)
        evidence: dict[str, Any] = {
            "rank": found.rank,
            "host": self._hosts.get(found.rank),
            "phase": phase,
            "gap_ms": round(found.gap * 1000, 1),
            "gap_share": round(found.share, 2),
            "phase_share": round(phase_share, 2),
            "steps": found.steps,
        }
        described = entry(AlertKind.STRAGGLER)
        return Alert(
            AlertKind.STRAGGLER,
            SEVERITY,
            step,
            f"rank {found.rank}",
            evidence,
            described.said,
            described.experiments,
        )


def _before_collective(window: RankWindow) -> float:
    _, data, forward = window.per_step()
    return data + forward
