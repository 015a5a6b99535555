"""The heatmap's buckets, the probe's share of a step, and the row planner: pure state,
no screen."""

from __future__ import annotations

import math
import sys

import pytest

from tests.frames import deep_run, hello, step
from tui.heatmap import MISSING, NON_FINITE, GradHeatmap
from tui.layout import CHART_MIN, plan_rows
from tui.state import MonitorState


def test_columns_fold_pairwise_keeping_each_bucket_max() -> None:
    heat = GradHeatmap(layers=2, capacity=8)
    for i in range(100):
        heat.add(i, [1.0, 1000.0 if i == 37 else 1.0])  # one spike among ones
    assert heat.stride == 16 and heat.columns == 7  # 100 steps in 16-step columns
    assert heat.column_steps(2) == (32, 47)
    assert list(heat.row(1)) == [1.0, 1.0, 1000.0, 1.0, 1.0, 1.0, 1.0]  # the spike kept
    assert heat.column_of(99) == 6


def test_non_finite_and_missing_gradients_are_marked() -> None:
    heat = GradHeatmap(layers=3, capacity=8)
    heat.add(0, [1.0, math.nan, None])
    heat.add(1, [2.0, 0.5, None])
    heat.add(2, [math.inf, 0.5, 1e39])  # beyond float32: still a finite value
    assert list(heat.row(0)) == [1.0, 2.0, NON_FINITE]
    assert list(heat.row(1)) == [NON_FINITE, 0.5, 0.5]
    assert list(heat.row(2))[:2] == [MISSING, MISSING]
    assert math.isfinite(heat.row(2)[2]) and heat.row(2)[2] > 1e38
    heat.add(10, [1.0, 1.0, 1.0])  # folds: a non-finite column stays non-finite
    assert heat.row(1)[0] == NON_FINITE
    assert heat.peak(0) == NON_FINITE and heat.peak(2) is not None


def test_a_thinned_record_fills_every_column_of_its_span() -> None:
    heat = GradHeatmap(layers=1, capacity=16)
    heat.add(0, [1.0])
    heat.add(9, [5.0], first_step=1)  # stands for steps 1..9
    assert list(heat.row(0)) == [1.0] + [5.0] * 9


def test_resample_spreads_the_whole_run_evenly_over_the_width() -> None:
    heat = GradHeatmap(layers=1, capacity=64)
    for i in range(60):
        heat.add(i, [float(i)])
    (narrow,) = heat.resample(25)
    assert len(narrow) == 25 and narrow[-1] == 59.0  # the last step is in
    assert narrow[:3] == [1.0, 3.0, 6.0]  # the largest of 2 or 3 columns each
    (wide,) = heat.resample(120)
    assert len(wide) == 120 and wide[:4] == [0.0, 0.0, 1.0, 1.0]  # each column twice


def footprint(heat: GradHeatmap) -> int:
    """Bytes the heatmap's values hold: its column arrays (buffers included), the list
    of them, and the newest column (a list of floats)."""
    arrays = {id(column): column for column in heat.sealed}
    size = sys.getsizeof(heat.sealed) + sum(sys.getsizeof(c) for c in arrays.values())
    if heat.newest is not None:
        size += sys.getsizeof(heat.newest) + 24 * len(heat.newest)
    return size


def test_memory_is_bounded_by_the_capacity_whatever_the_run_length() -> None:
    """One rank of the largest job a monitor must hold (200 layers, 100,000 steps, sent
    thinned 50:1) keeps its whole-run heatmap in under 0.5 MB: 64 ranks in 32 MB."""
    layers, capacity = 200, 512
    norms = [0.5 + i / 1000 for i in range(layers)]
    heat = GradHeatmap(layers=layers, capacity=capacity)
    sizes = []
    for i in range(49, 100_000, 50):
        heat.add(i, norms, first_step=i - 49)
        if i in (49_999, 99_999):
            sizes.append(footprint(heat))
    assert capacity // 2 <= heat.columns <= capacity
    assert heat.nbytes <= layers * capacity * 4  # float32: 2 KiB a layer at most
    assert sizes[1] < 500_000
    assert sizes[1] < sizes[0] * 1.1  # twice the run, not twice the memory


def test_run_state_fills_the_heatmap_from_step_records() -> None:
    state = MonitorState()
    for frame in deep_run(60, layers=4):
        state.apply(1, frame)
    run = state.runs["run-deep"]
    assert run.heatmap.layers == 4 and run.heatmap.columns == 60
    first, last = run.heatmap.row(0), run.heatmap.row(3)
    assert all(a < b / 100 for a, b in zip(first, last, strict=True))  # 1e-3 of the last


def test_probe_share_is_summed_over_recent_records_and_hidden_without_the_field() -> None:
    state = MonitorState()
    state.apply(1, hello())
    for i in range(3):
        state.apply(1, step(i))  # no probe_time: nothing to show
    run = state.runs["run-a"]
    assert run.probe_share is None
    spans = [(0.001, 0.01), (0.004, 0.1)]  # a thinned record weighs as its whole span
    for i, (cost, duration) in enumerate(spans, start=3):
        state.apply(1, {**step(i), "probe_time": cost, "duration": duration})
    assert run.probe_share == pytest.approx(0.005 / 0.11)


@pytest.mark.parametrize(
    ("height", "alerts", "layers"), [(22, 6, 11), (38, 6, 11), (22, 0, 3), (38, 40, 200)]
)
def test_rows_are_shared_with_a_readable_chart_and_alerts_before_layers(
    height: int, alerts: int, layers: int
) -> None:
    rows = plan_rows(height, alerts=alerts, layers=layers)
    assert rows.chart + rows.alerts + rows.layers == height
    assert rows.chart >= CHART_MIN
    assert rows.layers >= 3  # the header and two layers, at least
    if alerts <= 6:
        assert rows.alerts == 1 + max(alerts, 1)  # every alert line shown
    assert rows.layers <= layers + 1


def test_the_heatmap_takes_the_chart_rows_when_the_screen_is_short() -> None:
    small = plan_rows(22, alerts=6, layers=11, heatmap=True)
    assert small.chart == 0 and small.layers >= 11 + 2  # every layer, legend and axis
    tall = plan_rows(38, alerts=6, layers=11, heatmap=True)
    assert tall.chart >= CHART_MIN and tall.layers == 11 + 2
