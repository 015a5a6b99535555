"""Where a run's step time and memory go, as the monitor keeps them (pure: no widgets).

A step record may carry the step's cycle (its time as the run pays for it, the data
wait included), the seconds of each phase (data, forward, backward, optimizer, the
probe's own), the samples its forwards took and the memory in use at its end; a thinned
record carries their sums over its span. ``RunResources`` keeps, per step (sum / the
record's steps), each phase and the memory as bounded series (``tui.series``, as the
loss), and the recent records' sums, from which the status line's shares and the
memory's slope are read. A record that carries none of them changes nothing: a run
whose probe does not measure them shows none of it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from probes.kernel.schema import StepView
from probes.kernel.units import human_bytes
from tui.series import BucketedSeries

#: The phases of a step, bottom to top of the time chart: the data wait on top.
PHASES = ("forward", "backward", "optimizer", "probe", "other", "data")
#: Each phase's short name (the headless line, the chart's legend).
PHASE_WORDS = {
    "data": "data",
    "forward": "fwd",
    "backward": "bwd",
    "optimizer": "opt",
    "probe": "probe",
    "other": "other",
}
_Item = TypeVar("_Item")
RECENT_STEPS = 50  # the status line's shares and slope: over about this many steps


@dataclass(frozen=True)
class StepTimes:
    """One record's seconds (sums over its span) and how many steps it stands for."""

    step: int
    steps: int
    cycle: float
    phases: dict[str, float]  # every name of ``PHASES``; "other" the rest of the cycle


def step_times(view: StepView) -> StepTimes | None:
    """The record's phases, or None when it does not carry a finite, positive cycle."""
    cycle = view.cycle
    if cycle is None or not math.isfinite(cycle) or cycle <= 0:
        return None
    measured = {
        "data": view.data_time,
        "forward": view.forward_time,
        "backward": view.backward_time,
        "optimizer": view.optimizer_time,
        "probe": view.probe_time,
    }
    phases = {
        name: max(value, 0.0) if value is not None and math.isfinite(value) else 0.0
        for name, value in measured.items()
    }
    phases["other"] = max(cycle - sum(phases.values()), 0.0)
    return StepTimes(view.step, max(view.steps, 1), cycle, phases)


class RecentSteps(Generic[_Item]):
    """The newest items that cover about ``RECENT_STEPS`` steps (a thinned record's item
    counts as its steps): the oldest is dropped while the rest still cover them."""

    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self._steps: deque[int] = deque()
        self.steps = 0  # the steps the items cover

    def add(self, item: _Item, steps: int) -> None:
        self.items.append(item)
        self._steps.append(steps)
        self.steps += steps
        while len(self.items) > 1 and self.steps - self._steps[0] >= RECENT_STEPS:
            self.items.popleft()
            self.steps -= self._steps.popleft()


@dataclass
class RunResources:
    """A run's step time by phase and its memory: series per step, and the recent past."""

    phases: dict[str, BucketedSeries] = field(default_factory=dict)  # seconds per step
    memory: BucketedSeries = field(default_factory=BucketedSeries)  # bytes, at each record
    samples_per_s: float | None = None  # the latest record's
    # the recent records' times and memory, about ``RECENT_STEPS`` steps of them
    recent_times: RecentSteps[StepTimes] = field(default_factory=lambda: RecentSteps())
    recent_memory: RecentSteps[tuple[int, float]] = field(default_factory=lambda: RecentSteps())

    @property
    def timed(self) -> bool:
        """Did the run's records carry their phases?"""
        return bool(self.phases)

    @property
    def measured(self) -> bool:
        """Did the run's records carry their phases or their memory?"""
        return bool(self.phases) or len(self.memory) > 0

    def apply(self, view: StepView) -> None:
        """Take a step record's time and memory (nothing when it carries neither)."""
        times = step_times(view)
        if times is not None:
            for name in PHASES:
                series = self.phases.get(name)
                if series is None:
                    series = self.phases[name] = BucketedSeries()
                series.append(view.step, times.phases[name] / times.steps)
            self.recent_times.add(times, times.steps)
            if view.samples is not None and view.samples >= 0:
                self.samples_per_s = view.samples / times.cycle
        memory = view.memory
        if memory is not None and math.isfinite(memory) and memory >= 0:
            self.memory.append(view.step, memory)
            self.recent_memory.add((view.step, memory), max(view.steps, 1))

    def shares(self) -> dict[str, float] | None:
        """Each phase's share of the recent steps' cycle (None: not measured)."""
        times = self.recent_times.items
        cycle = sum(t.cycle for t in times)
        if cycle <= 0:
            return None
        return {name: sum(t.phases[name] for t in times) / cycle for name in PHASES}

    @property
    def memory_now(self) -> float | None:
        """Bytes in use at the latest record's end (None: not measured)."""
        points = self.recent_memory.items
        return points[-1][1] if points else None

    def memory_slope(self) -> float | None:
        """The memory's recent slope, bytes a step (a least-squares line through the
        recent records' memory; None with fewer than two steps of it)."""
        points = self.recent_memory.items
        if len(points) < 2:
            return None
        mean_x = sum(x for x, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        spread = sum((x - mean_x) ** 2 for x, _ in points)
        if spread <= 0:
            return None
        return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread

    def straggle(self) -> float | None:
        """The rank's straggler score: its mean data wait plus forward seconds a step over
        the recent records (a rank that waits on its data or computes slower than the
        others makes them wait at the all-reduce); None when not measured."""
        recent = self.recent_times
        if not recent.steps:
            return None
        waited = sum(t.phases["data"] + t.phases["forward"] for t in recent.items)
        return waited / recent.steps


def byte_size(value: float) -> str:
    """``3.1G``, ``512M``, ``12K``, ``800B`` (binary units, ``probes.kernel.units``)."""
    return human_bytes(value, compact=True)


def slope_words(slope: float) -> str:
    """``+12M/step``, ``-3.0K/step``, ``+0B/step``."""
    return ("-" if slope < 0 else "+") + byte_size(abs(slope)) + "/step"


#: The phases the headless summary line gives a share of the recent steps' cycle to.
SUMMARY_PHASES = ("data", "forward", "backward", "optimizer")


def summary_words(resources: RunResources) -> list[str]:
    """The headless summary line's words: ``data=23% fwd=30% bwd=35% opt=8%`` (each
    phase's share of the recent steps' cycle) and ``mem=1.2G`` (the memory now), each
    when the run's records carry them."""
    words: list[str] = []
    shares = resources.shares()
    if shares is not None:
        words += [f"{PHASE_WORDS[name]}={100 * shares[name]:.0f}%" for name in SUMMARY_PHASES]
    memory = resources.memory_now
    if memory is not None:
        words.append(f"mem={byte_size(memory)}")
    return words
