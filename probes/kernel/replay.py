"""Bounded, decimated history of a run's records (pure Python, no torch).

The sender keeps one so that a monitor started late still sees the run from step 0,
and uses ``thin`` to cap how many step records a second it finalises and sends.

Thinning never loses the evidence that matters most: the first record is always kept,
and a run of records collapses to its last one unless a record inside it holds a
non-finite value, in which case the first such record is kept instead. The kept record
says which steps it stands for in ``span`` and carries the peaks of those steps (the
policy is ``probes.kernel.thinning``'s, shared with the sender).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from probes.kernel.thinning import merge_records

Record = dict[str, Any]
T = TypeVar("T")


def has_non_finite(record: Record) -> bool:
    """True if any number in the record (nested lists and dicts included) is NaN or Inf."""
    return any(not math.isfinite(x) for x in iter_numbers(record))


def iter_numbers(value: Any) -> Iterator[float]:
    """Every float or int inside ``value``, depth first (bools excluded)."""
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_numbers(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from iter_numbers(item)


def span_of(record: Record) -> tuple[int, int]:
    """The steps a (possibly merged) step record stands for."""
    span = record.get("span")
    if span:
        return int(span[0]), int(span[1])
    step = int(record["step"])
    return step, step


def merge_steps(records: list[Record]) -> Record:
    """Collapse consecutive step (or eval) records into one that stands for all of them,
    with the peaks of its span (``probes.kernel.thinning``)."""
    return merge_records(records)


def thin(
    items: list[T],
    budget: int,
    *,
    is_step: Callable[[T], bool],
    merge: Callable[[list[T]], list[T]],
    keep_first: bool = False,
) -> list[T]:
    """About ``budget`` step items (plus the first step when ``keep_first``), in order.

    Consecutive step items are merged in runs of equal size by ``merge``, which returns
    what stands for the run (usually one item); other items pass through untouched and
    end a run.
    """
    steps = sum(1 for item in items if is_step(item))
    if steps <= budget or budget <= 0:
        return items
    out: list[T] = []
    group_size = math.ceil(steps / budget)
    run: list[T] = []
    first_pending = keep_first
    for item in items:
        if not is_step(item):
            if run:
                out.extend(merge(run))
                run = []
            out.append(item)
            continue
        if first_pending:
            first_pending = False
            out.append(item)
            continue
        run.append(item)
        if len(run) >= group_size:
            out.extend(merge(run))
            run = []
    if run:
        out.extend(merge(run))
    return out


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
        if kind == "step":
            if self._first_step is None:
                self._first_step = record
            else:
                self._append_thinned(self._steps, record)
        elif kind == "eval":
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
        records[:half] = [merge_steps(records[i : i + 2]) for i in range(0, half, 2)]
