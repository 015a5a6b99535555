"""A run's step time by phase and its memory: kept per step and bounded, told in the
status line (warning style under their alerts) and headless summaries, drawn beside the
loss chart on a wide terminal, a job's ranks listed by straggler score; all of it absent
for records that do not carry them."""

from __future__ import annotations

import asyncio
import io
import math

import pytest

from tests.frames import hello, probe_alert, short_run, step
from tests.kernel.test_ranks import rank_hello
from tests.tui.resource_frames import GIB, MIB, timed, timed_run
from tests.tui.test_many_ranks import LiveSource, line
from tests.waiting import settle
from tui.app import make_app
from tui.format import fit_status, status_fields
from tui.headless import HeadlessMonitor, summary_line
from tui.jobs import ranks_view
from tui.resources import PHASES, byte_size, slope_words
from tui.server import Connection
from tui.sources import FrameListSource
from tui.state import MonitorState
from tui.widgets import RanksPanel, StatusLine
from tui.widgets.resource_charts import MemoryChart, ResourceViews, TimeChart, binned

CONN = Connection(1, "test", None)


def state_of(frames: list) -> MonitorState:
    state = MonitorState()
    for frame in frames:
        state.apply(1, frame)
    return state


def roles(fields: list[str]) -> dict[str, str]:
    return {getattr(field, "role", ""): field for field in fields}


def test_phases_are_kept_per_step_and_a_thinned_record_counts_as_its_steps() -> None:
    state = state_of([hello()])
    run = state.runs["run-a"]
    state.apply(1, timed(step(0), cycle=0.04, data=0.25, memory=GIB))
    thinned = step(10)
    thinned["span"] = [1, 10]  # stands for steps 1 to 10: its sums are ten steps'
    state.apply(1, timed(thinned, cycle=0.04, data=0.5, memory=GIB + 10 * MIB))
    data = run.resources.phases["data"]
    assert data.points()[1] == pytest.approx([0.01, 0.02])  # seconds a step
    other = run.resources.phases["other"].points()[1]  # the cycle less every phase
    assert other == pytest.approx([0.04 * 0.06, 0.0])  # (phases over the cycle: none left)
    shares = run.resources.shares()
    assert shares is not None and shares["data"] == pytest.approx((0.01 + 0.2) / 0.44)
    assert run.resources.memory_slope() == pytest.approx(MIB)  # 10 MiB over 10 steps
    # data wait plus forward: 55% of 40 ms, then 80% of ten steps' 400 ms, over 11 steps
    assert run.resources.straggle() == pytest.approx((0.022 + 0.32) / 11)
    assert run.resources.samples_per_s == pytest.approx(320 / 0.4)


def test_the_series_stay_bounded_and_the_recent_window_about_fifty_steps() -> None:
    state = state_of([hello()])
    for i in range(6000):
        state.apply(1, timed(step(i), memory=GIB + i * MIB))
    resources = state.runs["run-a"].resources
    capacity = resources.memory.capacity
    assert len(resources.memory) <= capacity
    assert all(len(resources.phases[name]) <= capacity for name in PHASES)
    assert len(resources.recent_times.items) == len(resources.recent_memory.items) == 50
    assert resources.memory_slope() == pytest.approx(MIB)


def test_the_status_line_tells_the_data_wait_and_the_memory_at_80_columns() -> None:
    state = state_of(timed_run(60, data=0.25))
    run = state.runs["run-a"]
    fields = roles(status_fields(run, state, "sock"))
    assert fields["data_quiet"] == "data 27%"  # a slow batch every ten steps
    assert fields["memory_quiet"] == f"mem {byte_size(3.1 * GIB + 59 * 12 * MIB)} +12M/step"
    assert fields["data_quiet"].style == fields["memory_quiet"].style == ""
    shown, _ = fit_status(run, state, "sock", 78)  # 80 columns less the padding
    assert {"data_quiet", "memory_quiet"} <= set(roles(shown))


@pytest.mark.parametrize(
    ("kind", "role"),
    [("input_bound", "data"), ("memory_creep", "memory"), ("retained_graph", "memory")],
)
def test_a_field_turns_to_the_warning_style_when_its_alert_is_raised(kind: str, role: str) -> None:
    state = state_of([*timed_run(20), probe_alert(kind, "warning", 19, seq=100)])
    fields = roles(status_fields(state.runs["run-a"], state, "sock"))
    assert fields[role].style == "yellow"
    quiet = {"data": "memory_quiet", "memory": "data_quiet"}[role]
    assert fields[quiet].style == ""  # the other one stays quiet


def test_records_without_them_show_none_of_it() -> None:
    state = state_of(short_run(60))
    run = state.runs["run-a"]
    assert not run.resources.measured and run.resources.shares() is None
    assert run.resources.memory_now is None and run.resources.straggle() is None
    assert not {"data", "data_quiet", "memory", "memory_quiet"} & set(
        roles(status_fields(run, state, "sock"))
    )
    line_words = summary_line(run).split()
    assert not [word for word in line_words if word.split("=")[0] in {"data", "fwd", "mem"}]
    # a cycle of zero or a non-finite one is not a measurement either
    state.apply(1, timed(step(60), cycle=0.0))
    state.apply(1, timed(step(61), cycle=math.nan, memory=math.inf))
    assert not run.resources.measured


def test_the_headless_summary_gives_the_phases_and_the_memory() -> None:
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=50)
    for frame in timed_run(60):
        monitor.frame_received(CONN, frame)
    summary = next(line for line in out.getvalue().splitlines() if "step=50" in line)
    assert "steps/s=100.0 data=27% fwd=29% bwd=29% opt=8% mem=3.7G dropped=0" in summary


def test_slopes_and_sizes_read_short() -> None:
    assert [byte_size(v) for v in (800, 12 * 1024, 512 * MIB, 3.1 * GIB)] == [
        "800B",
        "12K",
        "512M",
        "3.1G",
    ]
    assert slope_words(12 * MIB) == "+12M/step" and slope_words(-3 * 1024) == "-3.0K/step"


def test_a_small_job_lists_its_ranks_by_straggler_score_highest_first() -> None:
    lines = [line(rank, 1000, 0.5, straggle=0.01 * (1 + (rank == 2))) for rank in range(4)]
    lines[3].straggle = None  # not measured: last
    assert [shown.rank for shown, _ in ranks_view(lines).listed] == [2, 0, 1, 3]


def test_a_big_job_lists_its_straggler() -> None:
    lines = [line(rank, 1000, 0.5, straggle=0.020 + 0.0001 * (rank % 3)) for rank in range(64)]
    lines[40] = line(40, 1000, 0.5, straggle=0.05)
    listed = ranks_view(lines, selected="r0").listed
    assert [(shown.rank, why) for shown, why in listed] == [(40, "straggler"), (0, "shown")]


def job_frames(world: int = 4, steps: int = 6) -> list:
    """A job whose rank 2 waits four times as long on its data as the others."""
    frames = [rank_hello(rank, world, job="slow-data") for rank in range(world)]
    for index in range(steps):
        for rank in range(world):
            data = 0.6 if rank == 2 else 0.15
            frame = step(index, run=f"r{rank}", seq=index + 2)
            frames.append(timed(frame, cycle=0.04, data=data, forward=0.3))
    return frames


async def test_the_ranks_panel_shows_the_straggler_first_with_its_score() -> None:
    app = make_app(LiveSource(job_frames()))
    app.notify = lambda *args, **kwargs: None  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(RanksPanel)
        await settle(pilot, lambda: panel.display and panel.row_count == 4, timeout=10)
        rows = [[str(cell).strip() for cell in panel.get_row_at(i)] for i in range(4)]
        assert [row[0].lstrip("▶") for row in rows] == ["r2", "r0", "r1", "r3"]
        assert rows[0][6] == "36ms" and rows[1][6] == "18ms"  # (0.6 + 0.3) x 40 ms


def replay_over(app: object) -> bool:
    run = app.current_run  # type: ignore[attr-defined]
    return run is not None and not run.connected and run.last_step >= 0


@pytest.mark.parametrize("size", [(160, 48), (80, 24), (120, 40)])
async def test_the_time_and_memory_charts_stand_beside_the_loss_chart_when_wide(
    size: tuple[int, int],
) -> None:
    app = make_app(FrameListSource(timed_run(120)))
    app.notify = lambda *args, **kwargs: None  # type: ignore[method-assign]
    async with app.run_test(size=size) as pilot:
        await settle(pilot, lambda: replay_over(app), timeout=10)
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "mem 4.5G +12M/step" in status.text, timeout=10)
        assert "data 27%" in status.text
        views = app.query_one(ResourceViews)
        if size[0] < 140:  # at 80x24 (and 120x40) the status line alone tells of them
            await asyncio.sleep(0.3)
            assert not views.display
            return
        chart = app.query_one(TimeChart)
        await settle(pilot, lambda: views.region.width == 64 and bool(chart.bars), timeout=10)
        assert list(chart.bars) == list(PHASES) and PHASES[-1] == "data"  # on top
        assert "time/step  ░░ data  ██ fwd" in chart.title_text
        memory = app.query_one(MemoryChart)
        await settle(pilot, lambda: len(memory.plotted) > 0, timeout=10)
        assert memory.plotted[-1] == pytest.approx(3.1 * GIB + 119 * 12 * MIB)
        assert "memory (rss)" in memory.title_text


async def test_a_run_that_does_not_measure_them_keeps_the_whole_row_for_its_loss() -> None:
    app = make_app(FrameListSource(short_run(60)))
    app.notify = lambda *args, **kwargs: None  # type: ignore[method-assign]
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, lambda: replay_over(app), timeout=10)
        await asyncio.sleep(0.3)
        assert not app.query_one(ResourceViews).display
        status = app.query_one(StatusLine).text
        assert "data " not in status and "mem " not in status


def test_bars_are_binned_to_fit_and_average_their_steps() -> None:
    state = state_of(timed_run(100))
    steps, means = binned(state.runs["run-a"].resources, 10)
    assert steps == [9, 19, 29, 39, 49, 59, 69, 79, 89, 99]
    # each bin holds one slow batch: its data wait is (9 x 10 ms + 20 ms) / 10
    assert means["data"] == pytest.approx([0.011] * 10)
