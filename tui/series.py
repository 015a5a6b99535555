"""A numeric series in bounded memory: recent points exact, older ones in buckets."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class BucketedSeries:
    """Points (x, y) appended in x order, in at most ``capacity`` buckets.

    While the series fits, every point is its own bucket. When it is full, the older
    half is merged pairwise into buckets that keep the min, max and last y, so a long
    run keeps its shape (what a chart a few hundred columns wide can show anyway) and
    the recent window stays at full resolution.
    """

    capacity: int = 2048
    xs: list[float] = field(default_factory=list)
    last: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.capacity < 4:
            raise ValueError("capacity must be at least 4")

    def __len__(self) -> int:
        return len(self.xs)

    def append(self, x: float, y: float) -> None:
        """Add one point; merge older buckets if the series is full."""
        self.xs.append(x)
        self.last.append(y)
        self.low.append(y)
        self.high.append(y)
        if len(self.xs) > self.capacity:
            self._compact()

    @property
    def latest(self) -> float | None:
        return self.last[-1] if self.last else None

    def points(self, *, finite_only: bool = True) -> tuple[list[float], list[float]]:
        """(xs, last ys), skipping non-finite ys unless asked not to."""
        if not finite_only:
            return list(self.xs), list(self.last)
        pairs = [(x, y) for x, y in zip(self.xs, self.last, strict=True) if math.isfinite(y)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def first_non_finite_x(self) -> float | None:
        """The x of the first bucket holding a NaN or Inf, if any."""
        for x, low, high in zip(self.xs, self.low, self.high, strict=True):
            if not (math.isfinite(low) and math.isfinite(high)):
                return x
        return None

    def _compact(self) -> None:
        half = (len(self.xs) // 2) & ~1
        xs, last, low, high = [], [], [], []
        for i in range(0, half, 2):
            xs.append(self.xs[i + 1])
            last.append(self.last[i + 1])
            low.append(_merge(self.low[i], self.low[i + 1], min))
            high.append(_merge(self.high[i], self.high[i + 1], max))
        self.xs[:half] = xs
        self.last[:half] = last
        self.low[:half] = low
        self.high[:half] = high


def _merge(a: float, b: float, pick: Callable[[float, float], float]) -> float:
    # A non-finite value is evidence: keep it rather than let min() or max() hide it.
    if not math.isfinite(a):
        return a
    if not math.isfinite(b):
        return b
    return pick(a, b)
