"""What the monitor looks like, pinned as SVG snapshots (pytest-textual-snapshot).

Each screen is drawn from fixed frames (their clock included), so a change in any
pixel of the layout, the chart or the colours shows up here as a failing diff. After
a deliberate change of the look, review the report and run
``python -m pytest tests/tui/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from textual.app import App
from textual.pilot import Pilot

from tests.frames import (
    anomaly_report,
    check_report,
    deep_run,
    exploding_run,
    fixed_and_exploding,
    hello,
    short_run,
    step,
)
from tests.tui.resource_frames import timed_run
from tests.waiting import settle
from tui.app import make_app
from tui.sources import FrameListSource
from tui.widgets import AlertsPanel, LossChart
from tui.widgets.resource_charts import MemoryChart, ResourceViews, TimeChart

SIZE = (120, 40)
# The monitor must read at a common default terminal and at a roomy one: each main
# view is pinned at both.
SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
SnapCompare = Callable[..., bool]  # the plugin's fixture


def until(predicate: Callable[[App], bool], redraws: int = 2) -> Callable[[Pilot], Awaitable[None]]:
    """A ``run_before`` that lets the app redraw until ``predicate(app)`` holds, then
    until the views' timer has redrawn ``redraws`` times more (they lay out on the tick
    after the one that drew: a table's columns widen as its cells fill)."""

    async def wait(pilot: Pilot) -> None:
        app = pilot.app
        await settle(pilot, lambda: predicate(app), timeout=10)
        drawn = app.redraws  # type: ignore[attr-defined]
        await settle(pilot, lambda: app.redraws >= drawn + redraws)  # type: ignore[attr-defined]

    return wait


def quiet(app: App) -> App:
    """The app without toasts (they expire on a timer, so a slow machine would catch
    some and not others; what they say is tested with the Pilot in test_app.py), and
    counting its redraws (``app.redraws``), so that a test can wait for the next one."""
    app.notify = lambda *args, **kwargs: None  # type: ignore[method-assign]
    original = app.redraw  # type: ignore[attr-defined]
    app.redraws = 0  # type: ignore[attr-defined]

    def redraw(force: bool = False) -> None:
        original(force)
        app.redraws += 1  # type: ignore[attr-defined]

    app.redraw = redraw  # type: ignore[attr-defined]  # before mount: the timer calls this
    return app


def app_on(frames: list) -> App:
    return quiet(make_app(FrameListSource(frames)))


def replay_over(app: App) -> bool:
    """The frames are all in and the run is marked disconnected."""
    run = app.current_run  # type: ignore[attr-defined]
    return run is not None and not run.connected


def presses(key: str, done: Callable[[App], bool]) -> Callable[[Pilot], Awaitable[None]]:
    """A ``run_before``: once the replay is over, press ``key`` and wait for ``done``."""

    async def press(pilot: Pilot) -> None:
        await until(replay_over)(pilot)
        await pilot.press(key)
        await until(done)(pilot)

    return press


def opens(key: str, screen: str) -> Callable[[Pilot], Awaitable[None]]:
    """A ``run_before``: once the replay is over, press ``key`` and wait for ``screen``."""

    async def press(pilot: Pilot) -> None:
        await until(replay_over)(pilot)
        await pilot.press(key)
        await until(lambda app: type(app.screen).__name__ == screen)(pilot)

    return press


def test_healthy_run(snap_compare: SnapCompare) -> None:
    frames = short_run(60)
    app = app_on(frames)
    assert snap_compare(
        app,
        terminal_size=SIZE,
        run_before=until(
            lambda app: len(app.query_one(LossChart).plotted.get("train loss", [])) == 60
        ),
    )


@SIZES
def test_main_screen(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    """A deep stack whose first six layers vanish: one vanishing_gradient naming the
    first (``0 +5``), eleven layers, the probe's share of the step."""
    app = app_on(deep_run(80, probe_share=0.012))
    assert snap_compare(
        app,
        terminal_size=size,
        run_before=until(
            lambda app: replay_over(app) and len(app.query_one(AlertsPanel).entries) == 1
        ),
    )


@SIZES
def test_heatmap(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    app = app_on(deep_run(80))
    assert snap_compare(
        app,
        terminal_size=size,
        run_before=presses("h", lambda app: bool(app.query_one("#heatmap").rows_text)),
    )


@SIZES
def test_comparison(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    app = app_on(fixed_and_exploding(40))

    async def compare(pilot: Pilot) -> None:
        await until(replay_over)(pilot)
        await pilot.press("m")
        await until(lambda app: type(app.screen).__name__ == "ComparePicker")(pilot)
        await pilot.press("m")
        await until(
            lambda app: (
                type(app.screen).__name__ == "CompareScreen"
                and app.screen.query_one("#ratios").row_count == 3
            )
        )(pilot)

    assert snap_compare(app, terminal_size=size, run_before=compare)


@SIZES
def test_run_list(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    frames = [
        *short_run(30, run="run-a", name="baseline"),
        *short_run(20, run="run-b", name="lr-0.1"),
        *short_run(10, run="run-c", name="resnet50-wd1e-4-long-name"),
    ]
    app = app_on(frames)
    assert snap_compare(
        app,
        terminal_size=size,
        run_before=until(lambda app: len(app.state.runs) == 3 and replay_over(app)),
    )


@SIZES
def test_anomaly_report(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    app = app_on([*short_run(48), anomaly_report(48)])  # a live report opens by itself
    assert snap_compare(
        app,
        terminal_size=size,
        run_before=until(lambda app: type(app.screen).__name__ == "AnomalyReportScreen"),
    )


@SIZES
def test_checks(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    app = app_on([*short_run(5), check_report(0)])
    assert snap_compare(app, terminal_size=size, run_before=opens("c", "ChecksScreen"))


def test_exploding_run_with_its_alert(snap_compare: SnapCompare) -> None:
    app = app_on(exploding_run())
    assert snap_compare(
        app,
        terminal_size=SIZE,
        run_before=until(lambda app: bool(app.query_one(AlertsPanel).entries)),
    )


@SIZES
def test_alert_detail(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    async def open_detail(pilot: Pilot) -> None:
        await until(lambda app: bool(app.query_one(AlertsPanel).entries))(pilot)
        pilot.app.query_one(AlertsPanel).focus()
        await pilot.press("enter")
        await until(lambda app: type(app.screen).__name__ == "AlertDetail")(pilot)

    app = app_on(exploding_run())
    assert snap_compare(app, terminal_size=size, run_before=open_detail)


def test_non_finite_values(snap_compare: SnapCompare) -> None:
    frames = [*short_run(20), step(20, loss=float("nan"), grad_norms=[1.0, float("inf"), None])]
    app = app_on(frames)
    assert snap_compare(
        app,
        terminal_size=SIZE,
        run_before=until(lambda app: app.query_one(LossChart).first_non_finite is not None),
    )


def test_help_screen(snap_compare: SnapCompare) -> None:
    assert snap_compare(
        app_on(short_run(5)), terminal_size=SIZE, run_before=opens("question_mark", "HelpScreen")
    )


def test_learning_rate_confirmation(snap_compare: SnapCompare) -> None:
    assert snap_compare(
        app_on(short_run(5)), terminal_size=SIZE, run_before=opens("minus", "Confirm")
    )


# --- 80x24 with a GPT-style model's layer names (issue 19, item 5) ---------------------

GPT_LAYERS = [
    "transformer.wte",
    "transformer.wpe",
    *(
        f"transformer.h.{block}.{part}"
        for block in (0, 11)
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    ),
    "transformer.ln_f",
    "lm_head",
]
EXPLODING = [
    GPT_LAYERS.index(n) for n in ("transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc")
]


def gpt_run(steps: int = 14) -> list:
    """A GPT-style model whose ``transformer.h.0.attn.c_proj`` and ``...mlp.c_fc``
    gradients grow tenfold a step from step 10, the loss with them: one alert naming
    the first layer and one more (``+1``)."""
    frames = [hello("run-gpt", "gpt2-small-lr3e-3", layers=GPT_LAYERS)]
    for i in range(steps):
        grads = [0.2 + 0.01 * k for k in range(len(GPT_LAYERS))]
        loss = 3.9 - 0.05 * i
        if i >= 10:
            for layer in EXPLODING:
                grads[layer] = 10.0 ** (i - 8)
            loss = 3.4 * 2 ** (i - 9)
        frame = step(i, "run-gpt", loss=loss, grad_norms=grads, layers=len(GPT_LAYERS))
        frame["probe_time"] = 0.021 * frame["duration"]
        frames.append(frame)
    return frames


def gpt_alerted(app: App) -> bool:
    return replay_over(app) and bool(app.query_one(AlertsPanel).entries)


def test_main_screen_gpt_80x24(snap_compare: SnapCompare) -> None:
    """The layer table keeps ``update/w`` and ``status`` on screen with names
    shortened from the middle; the alert's row keeps its folded count; the legend
    is under the plot; ``? Help`` is in the footer."""
    assert snap_compare(app_on(gpt_run()), terminal_size=(80, 24), run_before=until(gpt_alerted))


def test_alert_detail_gpt_80x24(snap_compare: SnapCompare) -> None:
    """The detail names the layer in full."""

    async def open_detail(pilot: Pilot) -> None:
        await until(gpt_alerted)(pilot)
        await pilot.press("enter")
        await until(lambda app: type(app.screen).__name__ == "AlertDetail")(pilot)

    assert snap_compare(app_on(gpt_run()), terminal_size=(80, 24), run_before=open_detail)


def test_help_screen_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(
        app_on(gpt_run()), terminal_size=(80, 24), run_before=opens("question_mark", "HelpScreen")
    )


# --- the step's time and memory (the records' phases, memory_source "rss") -------------


def input_bound_run() -> list:
    """``timed_run(120)``: a quarter of each 40 ms step waiting on its data (twice that
    every tenth step), the memory growing 12 MiB a step; the monitor's own rules raise
    ``input_bound`` on it (and its memory creeps too short a while for ``memory_creep``)."""
    return timed_run(120)


def resources_drawn(app: App) -> bool:
    """The replay is over, its alert listed, the memory in the status line; on a wide
    terminal, the time and memory charts drawn at their width."""
    line = app.query_one("#status")
    status = line.text  # type: ignore[attr-defined]
    if not (replay_over(app) and app.query_one(AlertsPanel).entries and "mem " in status):
        return False
    # the data field redrawn in the alert's style (the status line redraws at frame rate)
    if not any(field.startswith("data") for field in line.styled):  # type: ignore[attr-defined]
        return False
    if app.size.width < 140:
        return True
    chart = app.query_one(TimeChart)
    return (
        app.query_one(ResourceViews).region.width == 64
        and bool(chart.bars)
        # binned at the chart's own width (a first draw may come before its layout)
        and chart.drawn_width == chart.size.width
        and bool(app.query_one(MemoryChart).plotted)
    )


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_time_and_memory(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    """``data 27%`` in the warning's style (the alert) and ``mem 4.5G +12M/step`` in the
    status line at every size; at 160x48 the time a step by phase (stacked, the data
    wait on top) and the memory beside the loss chart."""
    assert snap_compare(
        app_on(input_bound_run()), terminal_size=size, run_before=until(resources_drawn, redraws=5)
    )
