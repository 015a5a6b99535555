"""Bounded, decimated history of a run's records (pure Python, no torch).

The sender keeps one, so that a monitor started late still sees the run from step 0.
(What the sender sends live is thinned before it gets here, by the policy of
``probes.kernel.thinning``.) The history bounds its memory by folding its older half
pairwise (``probes.kernel.fold``), each pair merged into one record as the thinning
policy merges records (``thinning.RECORDS.collapse``): the first non-finite record of
a pair shows, else the later one, with ``span`` saying which steps it stands for and
the peaks of those steps. The first step record is always kept as it was.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from probes.kernel.fold import fold_pairs
from probes.kernel.schema.spec import FrameKind
from probes.kernel.thinning import RECORDS

Record = dict[str, Any]


def _join(older: Record, newer: Record) -> Record:
    joined = RECORDS.collapse([older, newer])
    # Each step's loss is for the live monitor's rules; a decimated past keeps its peaks
    # (its memory stays bounded by the records kept, not by the steps they stand for).
    joined.pop("step_losses", None)
    return joined


class ReplayHistory:
    """A run's history for replay, in bounded memory.

    Step records: the first is kept as is; the rest at full resolution while they fit in
    ``capacity``, after which the older half is merged pairwise (so resolution falls off
    with age, as on a chart). Eval records are thinned the same way. Other records
    (events, alerts, anomaly reports) keep the most recent ``capacity``.
    """

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 4:
            raise ValueError("history capacity must be at least 4")
        self.capacity = capacity
        self._first_step: Record | None = None
        self._steps: list[Record] = []
        self._evals: list[Record] = []
        self._others: deque[Record] = deque(maxlen=capacity)

    def add(self, record: Record) -> None:
        """Remember one record (the sender calls this for every record it sends)."""
        kind = record.get("kind")
        if kind == FrameKind.STEP:
            if self._first_step is None:
                self._first_step = record
            else:
                self._append_thinned(self._steps, record)
        elif kind == FrameKind.EVAL:
            self._append_thinned(self._evals, record)
        else:
            self._others.append(record)

    def replay(self) -> list[Record]:
        """What to send a newly connected monitor, in the order it was sent (by ``seq``):
        an eval after the steps before it, so the monitor sees the run as it went."""
        steps = [self._first_step] if self._first_step is not None else []
        records = [*steps, *self._steps, *self._evals, *self._others]
        return sorted(records, key=lambda record: record.get("seq", 0))

    def __len__(self) -> int:
        first = 0 if self._first_step is None else 1
        return first + len(self._steps) + len(self._evals) + len(self._others)

    def _append_thinned(self, records: list[Record], record: Record) -> None:
        records.append(record)
        if len(records) <= self.capacity:
            return
        half = len(records) // 2
        half -= half % 2
        records[:half] = fold_pairs(records[:half], _join)
