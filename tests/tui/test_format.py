"""Screen text from state: numbers, sparklines, downsampling, ticks and the status line."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import pytest

from probes.kernel.wire import make_frame
from tui.format import (
    SPARK_BARS,
    axis_ticks,
    downsample,
    number,
    sparkline,
    status_fields,
    wants_log_scale,
)
from tui.run import RunState
from tui.state import MonitorState

# --- number ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (0, "0"),
        (0.0, "0"),
        (-0.0, "0"),
        (0.12345, "0.1235"),
        (-0.5, "-0.5"),
        (1.0, "1"),
        (1234.0, "1234"),
        (1e-5, "1.00e-05"),
        (-1e-5, "-1.00e-05"),
        (12345.0, "1.23e+04"),
        (1e20, "1.00e+20"),
    ],
)
def test_number(value: float | None, text: str) -> None:
    assert number(value) == text


def test_number_digits() -> None:
    assert number(0.123456, digits=2) == "0.12"
    assert number(123456.0, digits=2) == "1.2e+05"
    assert number(123456.0, digits=1) == "1.2e+05"  # never fewer than one decimal


# --- sparkline ---------------------------------------------------------------------------


@pytest.mark.parametrize("log", [True, False])
@pytest.mark.parametrize(("count", "width"), [(100, 10), (10, 10), (3, 10), (1, 1)])
def test_sparkline_width(count: int, width: int, log: bool) -> None:
    values = [1.0 + i for i in range(count)]
    line = sparkline(values, width, log=log)
    assert len(line) == min(count, width)
    assert set(line) <= set(SPARK_BARS)


def test_sparkline_shows_last_values() -> None:
    values = [1.0] * 50 + [10.0**i for i in range(8)]
    line = sparkline(values, 8)
    assert line[0] == SPARK_BARS[0]
    assert line[-1] == SPARK_BARS[-1]
    assert list(line) == sorted(line, key=SPARK_BARS.index)


def test_sparkline_increasing_linear() -> None:
    line = sparkline([float(i) for i in range(8)], 8, log=False)
    assert line == SPARK_BARS


@pytest.mark.parametrize("log", [True, False])
def test_sparkline_non_finite_marked(log: bool) -> None:
    values = [1.0, math.nan, 2.0, math.inf, 3.0, -math.inf, 4.0]
    line = sparkline(values, 20, log=log)
    assert len(line) == len(values)
    assert [i for i, c in enumerate(line) if c == "!"] == [1, 3, 5]
    assert all(c in SPARK_BARS for i, c in enumerate(line) if i not in (1, 3, 5))


def test_sparkline_all_non_finite() -> None:
    assert sparkline([math.nan, math.inf, -math.inf], 5) == "!!!"


@pytest.mark.parametrize("log", [True, False])
def test_sparkline_constant(log: bool) -> None:
    line = sparkline([3.0] * 6, 6, log=log)
    assert len(line) == 6
    assert len(set(line)) == 1
    assert line[0] in SPARK_BARS


def test_sparkline_log_with_zeros() -> None:
    line = sparkline([0.0, 1.0, 10.0, 0.0, 100.0], 5, log=True)
    assert len(line) == 5
    assert line[0] == SPARK_BARS[0]
    assert line[3] == SPARK_BARS[0]
    assert line[4] == SPARK_BARS[-1]
    assert SPARK_BARS.index(line[1]) < SPARK_BARS.index(line[2]) < SPARK_BARS.index(line[4])
    assert "!" not in line


def test_sparkline_empty() -> None:
    assert sparkline([], 10) == ""


# --- downsample --------------------------------------------------------------------------


def test_downsample_small_input_unchanged() -> None:
    xs, ys = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    assert downsample(xs, ys, 3) == (xs, ys)
    assert downsample(xs, ys, 10) == (xs, ys)


@pytest.mark.parametrize(
    ("count", "limit"),
    [(10, 3), (100, 10), (1000, 16), (101, 10), (17, 16), (5000, 240), (3, 2)],
)
def test_downsample_limit_and_last(count: int, limit: int) -> None:
    xs = [float(i) for i in range(count)]
    ys = [float(i) * 2 for i in range(count)]
    out_x, out_y = downsample(xs, ys, limit)
    assert len(out_x) == len(out_y)
    assert 2 <= len(out_x) <= limit
    assert out_x[0] == xs[0]
    assert out_x[-1] == xs[-1]
    assert out_y[-1] == ys[-1]
    assert out_x == sorted(set(out_x))
    assert all(y == 2 * x for x, y in zip(out_x, out_y, strict=True))


# --- axis ticks and scale ----------------------------------------------------------------


@pytest.mark.parametrize(("low", "high", "count"), [(0.0, 1.0, 5), (-3.0, 7.0, 2), (1.0, 1e6, 7)])
def test_axis_ticks(low: float, high: float, count: int) -> None:
    ticks = axis_ticks(low, high, count)
    assert len(ticks) == count
    assert ticks[0] == low
    assert ticks[-1] == pytest.approx(high)
    gaps = [b - a for a, b in pairwise(ticks)]
    assert all(g == pytest.approx(gaps[0]) for g in gaps)
    assert gaps[0] > 0


def test_axis_ticks_degenerate() -> None:
    assert axis_ticks(2.0, 2.0) == [2.0]
    assert axis_ticks(3.0, 1.0) == [3.0]
    assert axis_ticks(0.0, 1.0, 1) == [0.0]


def test_axis_ticks_default_count() -> None:
    assert axis_ticks(0.0, 4.0) == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1e-2, 1.0, 1e3, 1e6], True),
        ([1e6, 1e-2], True),
        ([0.1, 0.5, 0.9], False),
        ([1.0, 30.0], False),  # 1.48 decades: linear
        ([0.01, 0.5], True),  # 1.7 decades: a loss that fell fifty-fold reads better in log
        ([0.0, -5.0, 1e-2, 1e6], True),
        ([1e-9], False),
        ([], False),
        ([0.0, -1.0, -1e9], False),
        ([1.0, math.nan, math.inf, 2.0], False),
    ],
)
def test_wants_log_scale(values: list[float], expected: bool) -> None:
    assert wants_log_scale(values) is expected


# --- status line -------------------------------------------------------------------------

LAYERS = ["encoder.0", "encoder.2", "head"]


def hello(run: str = "run-a", name: str = "mlp") -> dict[str, Any]:
    return make_frame("hello", run=run, name=name, pid=1, layers=LAYERS, param_counts=[10, 20, 30])


def step(index: int, *, time: float, loss: float, run: str = "run-a") -> dict[str, Any]:
    return make_frame(
        "step",
        run=run,
        step=index,
        time=time,
        scalars={"loss": loss},
        grad_norms=[0.1, 0.2, 0.3],
        grad_norm_total=0.37,
        lr=[1e-3],
        dropped=0,
        seq=index + 1,
    )


def test_status_without_run() -> None:
    fields = status_fields(None, MonitorState(), "unix:/tmp/m.sock")
    assert fields[0] == "traintop"
    assert any("unix:/tmp/m.sock" in f for f in fields)
    assert any("waiting" in f for f in fields)


def fed_state(steps: int = 11, rate: float = 50.0) -> tuple[MonitorState, RunState]:
    state = MonitorState()
    state.apply(1, hello())
    for i in range(steps):
        state.apply(1, step(i, time=1000.0 + i / rate, loss=1.0 / (i + 1)))
    run = state.runs["run-a"]
    return state, run


def test_status_for_connected_run() -> None:
    state, run = fed_state(steps=11, rate=50.0)
    assert run.name == "mlp"
    assert run.layers == LAYERS
    assert run.last_step == 10
    assert run.steps_per_s == pytest.approx(50.0)
    fields = status_fields(run, state, "unix:/tmp/m.sock")
    assert fields[0] == "mlp"
    assert "step 10" in fields
    assert "50.0 steps/s" in fields
    assert f"loss {number(1.0 / 11)}" in fields
    assert "connected" in fields
    assert not any("disconnected" in f for f in fields)
    assert not any("rejected" in f for f in fields)


def test_status_large_step_and_rate() -> None:
    state, run = fed_state(steps=1001, rate=2000.0)
    fields = status_fields(run, state, "x")
    assert "step 1,000" in fields
    assert "2,000.0 steps/s" in fields


def test_status_rate_unknown_with_one_step() -> None:
    state, run = fed_state(steps=1)
    assert run.steps_per_s is None
    fields = status_fields(run, state, "x")
    assert "step 0" in fields
    assert "- steps/s" in fields


def test_status_after_disconnect() -> None:
    state, run = fed_state()
    events = state.connection_closed(1, "connection reset")
    assert len(events) == 1
    fields = status_fields(run, state, "x")
    assert "connected" not in fields
    assert any(f.startswith("disconnected") for f in fields)
    assert any("connection reset" in f for f in fields)


def test_status_after_bye_says_finished() -> None:
    state, run = fed_state()
    state.apply(1, make_frame("bye", run="run-a"))
    state.connection_closed(1, "eof")
    fields = status_fields(run, state, "x")
    assert "finished" in fields
    assert not any("disconnected" in f for f in fields)


def test_status_counts_rejections_and_runs() -> None:
    state, run = fed_state()
    state.apply(2, hello(run="run-b", name="other"))
    state.apply(3, make_frame("step", step=1))  # no hello on conn 3
    fields = status_fields(run, state, "x")
    assert "rejected 1" in fields
    assert "2 runs" in fields


def test_a_connected_run_gone_quiet_says_for_how_long() -> None:
    from tests.frames import hello, step
    from tui.format import QUIET_AFTER_S, connection_label

    state = MonitorState()
    for frame in (hello(), step(0)):
        state.apply(1, frame)
    run = state.runs["run-a"]
    assert connection_label(run, now=run.last_frame_at + 1) == "connected"
    later = run.last_frame_at + QUIET_AFTER_S + 32
    assert connection_label(run, now=later) == f"connected, quiet {QUIET_AFTER_S + 32:.0f}s"
    run.control["paused"] = True  # a paused run is quiet on purpose
    assert connection_label(run, now=later) == "connected"
