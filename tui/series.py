"""A numeric series in bounded memory: recent points exact, older ones in buckets."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from probes.kernel.fold import fold_pairs


@dataclass
class BucketedSeries:
    """Points (x, y) appended in x order, in at most ``capacity`` buckets.

    While the series fits, every point is its own bucket. When it is full, all but the
    newest quarter are folded into buckets of ``stride`` points each, keeping the min,
    max and last y; when those are too many, they are merged pairwise and the stride
    doubles (``probes.kernel.fold``). So the whole run keeps an even resolution (what a
    chart a few hundred columns wide can show anyway; the start of a long run is never
    squeezed out), and the newest points stay exact. The first non-finite x is kept exactly.
    """

    capacity: int = 2048
    xs: list[float] = field(default_factory=list)  # each bucket's last x
    last: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # points per bucket
    stride: int = 1  # points per bucket in the folded part
    _first_bad_x: float | None = None

    def __post_init__(self) -> None:
        if self.capacity < 4:
            raise ValueError("capacity must be at least 4")

    def __len__(self) -> int:
        return len(self.xs)

    def append(self, x: float, y: float) -> None:
        """Add one point; fold older buckets if the series is full."""
        self.xs.append(x)
        self.last.append(y)
        self.low.append(y)
        self.high.append(y)
        self.counts.append(1)
        if self._first_bad_x is None and not math.isfinite(y):
            self._first_bad_x = x
        if len(self.xs) > self.capacity:
            self._compact()

    @property
    def latest(self) -> float | None:
        return self.last[-1] if self.last else None

    @property
    def latest_x(self) -> float | None:
        """The x of the latest point (e.g. the step of the latest evaluation)."""
        return self.xs[-1] if self.xs else None

    def points(self, *, finite_only: bool = True) -> tuple[list[float], list[float]]:
        """(xs, last ys), skipping non-finite ys unless asked not to."""
        if not finite_only:
            return list(self.xs), list(self.last)
        pairs = [(x, y) for x, y in zip(self.xs, self.last, strict=True) if math.isfinite(y)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def first_non_finite_x(self) -> float | None:
        """The x of the first NaN or Inf ever appended, if any."""
        return self._first_bad_x

    def _compact(self) -> None:
        exact = self.capacity // 4  # the newest buckets stay as they are
        folded = self._regroup(len(self.xs) - exact, self.stride)
        while len(folded) > self.capacity // 2:
            self.stride *= 2
            folded = fold_pairs(folded, _join)
        tail = list(zip(self.xs, self.last, self.low, self.high, self.counts, strict=True))[-exact:]
        self.xs, self.last, self.low, self.high, self.counts = _columns(folded + tail)

    def _regroup(self, end: int, stride: int) -> list[Bucket]:
        """Buckets ``[0, end)`` regrouped into buckets of ``stride`` points (the last
        group may hold fewer)."""
        groups: list[Bucket] = []
        for bucket in zip(
            self.xs[:end],
            self.last[:end],
            self.low[:end],
            self.high[:end],
            self.counts[:end],
            strict=True,
        ):
            if groups and groups[-1][4] < stride:
                groups[-1] = _join(groups[-1], bucket)
            else:
                groups.append(bucket)
        return groups


Bucket = tuple[float, float, float, float, int]  # last x, last y, low, high, count


def _join(older: Bucket, newer: Bucket) -> Bucket:
    return (
        newer[0],
        newer[1],
        _merge(older[2], newer[2], min),
        _merge(older[3], newer[3], max),
        older[4] + newer[4],
    )


def _columns(
    buckets: list[Bucket],
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    xs, last, low, high, counts = [], [], [], [], []
    for x, y, lo, hi, count in buckets:
        xs.append(x)
        last.append(y)
        low.append(lo)
        high.append(hi)
        counts.append(count)
    return xs, last, low, high, counts


def _merge(a: float, b: float, pick: Callable[[float, float], float]) -> float:
    # A non-finite value is evidence: keep it rather than let min() or max() hide it.
    if not math.isfinite(a):
        return a
    if not math.isfinite(b):
        return b
    return pick(a, b)
