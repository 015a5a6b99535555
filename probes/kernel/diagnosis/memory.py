"""Rung 8, where the step's memory goes: memory that keeps growing (``memory_creep``) and
the graphs of earlier steps kept alive (``retained_graph``, a cause of the creep).

Step records carry ``memory`` (bytes at the step's end: the CUDA allocator's, or the
process's resident memory; the hello's ``memory_source`` says which) and, on sampled
steps, ``retained_graphs`` (``probes.runtime.measure.retained``). A record without them
says nothing here.
"""

from __future__ import annotations

import math
from itertools import pairwise

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.units import human_bytes

_BUCKETS = 256  # the run's memory is kept as at most twice this many floors


class _Floors:
    """The run's memory as floors: the lowest value of each bucket of ``width`` steps;
    buckets merge in pairs (the width doubles) to stay bounded on long runs."""

    def __init__(self) -> None:
        self.width = 1
        self.floors: dict[int, float] = {}  # bucket -> its lowest memory

    def add(self, step: int, memory: float) -> None:
        bucket = step // self.width
        floor = self.floors.get(bucket)
        self.floors[bucket] = memory if floor is None else min(floor, memory)
        if len(self.floors) > 2 * _BUCKETS:
            self.width *= 2
            merged: dict[int, float] = {}
            for old, value in self.floors.items():
                new = old // 2
                merged[new] = min(value, merged.get(new, value))
            self.floors = merged

    def lowest(self, first: int, last: int) -> float | None:
        """The lowest memory of the buckets between steps ``first`` and ``last``."""
        values = [
            v for b, v in self.floors.items() if first <= b * self.width and b * self.width <= last
        ]
        return min(values) if values else None


class MemoryCreep(Rule):
    """Memory whose floor rises from part to part of the latest half of the run (split
    in ``creep_parts`` parts, at least ``creep_min_steps`` steps past
    ``creep_warmup_steps``), by at least ``creep_growth`` of the memory held."""

    kind: str = AlertKind.MEMORY_CREEP

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._floors = _Floors()

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        memory = view.memory if view.memory_min is None else view.memory_min
        if memory is None or not math.isfinite(memory) or memory <= 0:
            return None
        t = self.t
        self._floors.add(view.step, memory)
        start = max(t.creep_warmup_steps, view.step // 2)
        span = view.step - start + 1
        if span < t.creep_min_steps:
            return []
        part = span / t.creep_parts
        floors = [
            self._floors.lowest(int(start + i * part), int(start + (i + 1) * part) - 1)
            for i in range(t.creep_parts)
        ]
        if any(f is None for f in floors):
            return []
        levels = [f for f in floors if f is not None]
        rising = all(later > earlier for earlier, later in pairwise(levels))
        growth = levels[-1] - levels[0]
        if not rising or growth < t.creep_growth * levels[0]:
            return []
        held = view.memory if view.memory is not None else levels[-1]
        per_step = growth / max(span - part, 1.0)
        evidence = {
            "memory": human_bytes(held),
            "growth": human_bytes(growth),
            "per_step": human_bytes(per_step),
            "steps": span,
            "source": history.info.memory_source or "rss",
        }
        return [self.alert(view.step, "", evidence)]


class RetainedGraph(Rule):
    """``retained_graphs`` (sampled steps whose loss is still part of a live graph two
    steps or more after their update) at least ``retained_graphs``."""

    kind: str = AlertKind.RETAINED_GRAPH
    severity: Severity = Severity.WARNING

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if not view.sampled and not view.retained_graphs:
            return None  # (a record that did not look)
        graphs = view.retained_graphs or 0
        if graphs < self.t.retained_graphs:
            return []
        origin = view.retained_origin or "an earlier step's loss"
        kept_since = _origin_step(origin)
        evidence = {
            "graphs": graphs,
            "origin": origin,
            "steps": view.step - kept_since if kept_since is not None else "-",
        }
        return [self.alert(view.step, "loss", evidence)]


def _origin_step(origin: str) -> int | None:
    """The step named at the end of ``origin`` (``the loss of step 20``: 20)."""
    last = origin.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else None
