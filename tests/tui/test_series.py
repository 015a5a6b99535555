"""BucketedSeries: bounded memory, exact recent points, preserved envelope and NaNs."""

from __future__ import annotations

import math
import random

import pytest

from tui.series import BucketedSeries


def test_capacity_too_small() -> None:
    for capacity in (-5, 0, 3):
        with pytest.raises(ValueError):
            BucketedSeries(capacity=capacity)
    assert BucketedSeries(capacity=4).capacity == 4


def test_empty() -> None:
    series = BucketedSeries(capacity=8)
    assert len(series) == 0
    assert series.latest is None
    assert series.points() == ([], [])
    assert series.first_non_finite_x() is None


def test_below_capacity_keeps_every_point() -> None:
    series = BucketedSeries(capacity=16)
    xs = [float(i) for i in range(16)]
    ys = [math.sin(i) for i in range(16)]
    for x, y in zip(xs, ys, strict=True):
        series.append(x, y)
    assert len(series) == 16
    assert series.points() == (xs, ys)
    assert series.low == ys
    assert series.high == ys
    assert series.latest == ys[-1]


@pytest.mark.parametrize(("capacity", "count"), [(4, 5), (4, 1000), (16, 17), (64, 10_000)])
def test_beyond_capacity(capacity: int, count: int) -> None:
    rng = random.Random(capacity * 7919 + count)
    series = BucketedSeries(capacity=capacity)
    ys = [rng.uniform(-100.0, 100.0) for _ in range(count)]
    for i, y in enumerate(ys):
        series.append(float(i), y)
        assert len(series) <= capacity
        # The latest point is always exact.
        assert series.xs[-1] == float(i)
        assert series.latest == y
        # x stays sorted.
        assert series.xs == sorted(series.xs)
    assert len(series.xs) == len(series.last) == len(series.low) == len(series.high)
    # The envelope of the buckets is the envelope of the data.
    assert min(series.low) == min(ys)
    assert max(series.high) == max(ys)
    # Each bucket's envelope contains its own last value.
    for low, last, high in zip(series.low, series.last, series.high, strict=True):
        assert low <= last <= high


def test_bucket_envelope_contains_its_points() -> None:
    rng = random.Random(1)
    series = BucketedSeries(capacity=8)
    ys = [rng.uniform(0.0, 1.0) for _ in range(500)]
    for i, y in enumerate(ys):
        series.append(float(i), y)
    # A bucket with x == b stands for the points after the previous bucket up to b.
    previous = -1.0
    for x, low, high in zip(series.xs, series.low, series.high, strict=True):
        inside = ys[int(previous) + 1 : int(x) + 1]
        assert inside
        assert low == min(inside)
        assert high == max(inside)
        previous = x
    assert previous == 499.0


def test_recent_points_exact() -> None:
    series = BucketedSeries(capacity=32)
    for i in range(1000):
        series.append(float(i), float(i * i))
    # The newest quarter of the buckets are single points.
    buckets = list(zip(series.xs, series.last, series.low, series.high, strict=True))
    for x, last, low, high in buckets[-8:]:
        assert last == low == high == x * x


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_survives_compaction(bad: float) -> None:
    series = BucketedSeries(capacity=8)
    for i in range(5_000):
        series.append(float(i), bad if i == 3 else 1.0 + i % 3)
    assert len(series) <= 8
    assert series.first_non_finite_x() == 3.0
    # and the envelope of a folded bucket still shows it
    assert any(
        not math.isfinite(low) or not math.isfinite(high)
        for low, high in zip(series.low, series.high, strict=True)
    )


def test_first_non_finite_x_is_the_first() -> None:
    series = BucketedSeries(capacity=100)
    for i in range(50):
        series.append(float(i), math.nan if i in (20, 30) else 1.0)
    assert series.first_non_finite_x() == 20.0


def test_points_finite_only() -> None:
    series = BucketedSeries(capacity=16)
    ys = [1.0, math.nan, 2.0, math.inf, 3.0, -math.inf]
    for i, y in enumerate(ys):
        series.append(float(i), y)
    assert series.points() == ([0.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    assert series.points(finite_only=True) == ([0.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    xs, all_ys = series.points(finite_only=False)
    assert xs == [float(i) for i in range(6)]
    assert len(all_ys) == 6
    assert math.isnan(all_ys[1])
    assert all_ys[3] == math.inf
    # points() returns copies.
    xs.append(99.0)
    assert len(series) == 6


@pytest.mark.parametrize("count", [10_000, 100_000])
def test_a_long_series_keeps_an_even_resolution_from_its_start(count: int) -> None:
    """The start of a long run is never squeezed out: every folded bucket holds the same
    number of points, and the first one begins at the first point."""
    series = BucketedSeries(capacity=2048)
    for i in range(count):
        series.append(float(i), float(i))
    assert sum(series.counts) == count
    assert series.xs[0] == series.counts[0] - 1 <= count / 500  # within 0.2% of step 0
    folded = [c for c in series.counts if c > 1]
    assert set(folded[:-1]) == {series.stride}
    assert series.counts[-(2048 // 4) :] == [1] * (2048 // 4)  # the newest quarter exact
    spans = {
        b - a
        for a, b, n in zip(series.xs, series.xs[1:], series.counts[1:], strict=False)
        if n == series.stride
    }
    assert spans == {float(series.stride)}


def test_first_non_finite_x_is_exact_after_compaction() -> None:
    series = BucketedSeries(capacity=64)
    for i in range(100_000):
        series.append(float(i), math.nan if i == 10 else 1.0)
    assert series.first_non_finite_x() == 10.0
