"""The monitor one lives in: small terminals, the heatmap, runs side by side, the status
line's counts, the alerts' order and the help, driven by Textual's Pilot."""

from __future__ import annotations

import math

from probes.kernel.diagnosis import Thresholds
from tests.frames import (
    deep_run,
    exploding_run,
    fixed_and_exploding,
    hello,
    probe_alert,
    short_run,
    step,
)
from tests.waiting import settle
from tui.app import make_app
from tui.format import number
from tui.sources import FrameListSource
from tui.widgets import AlertsPanel, GradHeatmapView, LayerTable, LossChart, StatusLine


def quiet(app):
    app.notify = lambda *args, **kwargs: None  # toasts would cover what is read below
    return app


def replay_over(app) -> bool:
    run = app.current_run
    return run is not None and not run.connected


async def test_at_80x24_the_status_line_is_whole_and_alerts_come_before_layers() -> None:
    app = quiet(make_app(FrameListSource(deep_run(80, probe_share=0.012))))
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.query_one(AlertsPanel)
        await settle(pilot, lambda: replay_over(app) and len(panel.entries) >= 1)
        status = app.query_one(StatusLine).text
        assert len(status) <= 78  # inside its padding: nothing cut
        assert status.startswith("sigmoid-")  # the name gives way first (the run list)
        # the vanishing stack is one incident naming its first layer
        for field in (
            "step 79",
            "100/s",
            "loss",
            "disconnected",
            "alerts 1/1",
            "drop 0",
            "probe 1.2%",
        ):
            assert field in status
        chart, table = app.query_one(LossChart), app.query_one(LayerTable)
        await settle(pilot, lambda: panel.size.height == 1 + len(panel.entries))
        assert chart.size.height >= 9  # a readable chart (its border row aside)
        assert panel.region.y < table.region.y  # alerts first, then the layers
        assert table.size.height >= 3  # the header and two layers at least


async def test_the_probe_share_is_hidden_when_records_lack_it() -> None:
    app = quiet(make_app(FrameListSource(short_run(20))))
    async with app.run_test(size=(160, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "step 19" in status.text)
        assert "probe" not in status.text


async def test_status_counts_active_and_raised_and_the_panel_follows_the_checklist() -> None:
    frames = [
        *exploding_run(),
        # the explosion clears (once healthy for ``hold_steps``: it hovered about its bound)
        *(step(i) for i in range(14, 15 + Thresholds().hold_steps)),
        probe_alert("leakage", "warning", 18, seq=1),
        probe_alert("duplicates", "warning", 12, seq=2),
        probe_alert("broadcast_in_loss", "error", 19, seq=3),
    ]
    app = quiet(make_app(FrameListSource(frames)))
    async with app.run_test(size=(160, 40)) as pilot:
        panel, status = app.query_one(AlertsPanel), app.query_one(StatusLine)
        await settle(pilot, lambda: replay_over(app) and len(panel.entries) == 4)
        assert "alerts 3 active / 4 raised" in status.text
        order = [(e.alert.severity, e.alert.step, e.alert.kind, e.active) for e in panel.entries]
        # active first, along the checklist: data (leakage), the loss contract, then an
        # unknown kind among the update checks; the cleared explosion last
        assert order == [
            ("warning", 18, "leakage", True),
            ("error", 19, "broadcast_in_loss", True),
            ("warning", 12, "duplicates", True),
            ("error", 11, "exploding_gradient", False),
        ]
        panel.focus()
        await pilot.press("enter")  # the first line: the first root cause to look at
        await settle(pilot, lambda: type(app.screen).__name__ == "AlertDetail")
        assert app.screen.entry.alert.kind == "leakage"  # type: ignore[attr-defined]


async def test_h_toggles_the_heatmap_of_the_whole_run() -> None:
    frames = deep_run(60, layers=5)
    frames.append(step(60, "run-deep", grad_norms=[1e-5, math.nan, 1e-3, 0.0, 1.0], layers=5))
    app = quiet(make_app(FrameListSource(frames)))
    async with app.run_test(size=(100, 30)) as pilot:
        heat, table = app.query_one(GradHeatmapView), app.query_one(LayerTable)
        await settle(pilot, lambda: replay_over(app))
        assert not heat.display and table.display
        await pilot.press("h")
        await settle(pilot, lambda: len(heat.rows_text) == 5)
        assert not table.display
        names = [row.split()[0] for row in heat.rows_text]
        assert names == ["0", "2", "4", "6", "8"]
        cells = [row[3:] for row in heat.rows_text]  # after the names
        assert all(len(set(line)) <= 3 for line in cells[:1])  # steady: one bar level
        assert cells[0][0] < cells[4][0]  # ▁ (1e-5) under █ (the last layer's 0.2)
        assert cells[1].rstrip().endswith("!")  # the NaN of the last step, marked
        assert cells[3].rstrip().endswith("0")  # an exact zero
        assert "! non-finite" in heat.legend_text and "0 zero" in heat.legend_text
        assert heat.axis_text.split() == ["0", "30", "60"]  # the whole run, step 0 to 60
        await pilot.press("h")
        await settle(pilot, lambda: table.display and not heat.display)


async def test_a_deep_model_heatmap_scrolls() -> None:
    names = [f"block{i}" for i in range(60)]
    frames = [
        hello(layers=names),
        *(step(i, grad_norms=[1.0 + j for j in range(60)], layers=60) for i in range(10)),
    ]
    app = quiet(make_app(FrameListSource(frames)))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: replay_over(app))
        await pilot.press("h")
        heat = app.query_one(GradHeatmapView)
        await settle(pilot, lambda: len(heat.rows_text) == 60)
        scroll = heat.query_one("#heat-rows-scroll")
        await settle(pilot, lambda: scroll.max_scroll_y > 0)  # 60 rows in fewer
        scroll.scroll_end(animate=False)
        await settle(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y)


async def test_m_compares_two_runs_with_losses_overlaid_and_ratios() -> None:
    from tui.screens.compare import ComparePicker, CompareScreen
    from tui.widgets.loss_overlay import LossOverlay

    app = quiet(make_app(FrameListSource(fixed_and_exploding(40))))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: replay_over(app) and len(app.state.runs) == 2)
        await pilot.press("m")
        await settle(pilot, lambda: isinstance(app.screen, ComparePicker))
        await pilot.press("m")  # both runs are picked already: compare
        await settle(pilot, lambda: isinstance(app.screen, CompareScreen))
        screen = app.screen
        overlay = screen.query_one(LossOverlay)
        await settle(pilot, lambda: set(overlay.plotted) == {"exploding (fixed)", "exploding"})
        assert screen.header_text.startswith("ref ● exploding (fixed)")
        table = screen.query_one("#ratios")
        await settle(pilot, lambda: table.row_count == 3)
        row = [str(cell) for cell in table.get_row_at(1)]  # encoder.2: 0.3 in the fixed run
        assert row[0] == "encoder.2" and row[1] == "0.3"
        assert row[2] == "inf" and row[3] == "inf"  # exploding's latest, over 0.3
        peak = 0.9 * 1.5**29 / 0.3  # its largest finite norm over the reference's
        assert row[4] == f"{number(peak, 3)}x !"  # ! : it went non-finite
        await pilot.press("r")  # the other run as the reference
        await settle(pilot, lambda: screen.header_text.startswith("ref ● exploding "))
        await pilot.press("escape")
        await settle(pilot, lambda: not isinstance(app.screen, CompareScreen))


async def test_replay_of_several_logs_opens_on_their_comparison() -> None:
    from tui.screens.compare import CompareScreen

    app = quiet(
        make_app(FrameListSource(fixed_and_exploding(10)), mode="replay", compare_on_start=True)
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: isinstance(app.screen, CompareScreen))
        await settle(pilot, lambda: "exploding" in app.screen.header_text)


async def test_m_with_one_run_says_how_to_compare() -> None:
    app = make_app(FrameListSource(short_run(5)))
    async with app.run_test() as pilot:
        await settle(pilot, lambda: replay_over(app))
        await pilot.press("m")
        await settle(pilot, lambda: any("two runs" in n.message for n in app._notifications))


def test_the_help_says_what_q_does_in_the_demo_and_outside_it() -> None:
    from tui.screens.help import keys_for

    said = {mode: dict(keys_for(mode)) for mode in ("live", "demo", "replay")}
    assert "the run goes on untouched" in said["live"]["q"]
    assert "stops the demo trainer" in said["demo"]["q"]
    assert "untouched" not in " ".join(said["demo"].values())
    assert "a replay has none" in " ".join(said["replay"].values())


async def test_the_demo_app_shows_the_demo_help() -> None:
    from textual.widgets import Static

    from tests.tui.test_app import plain

    app = make_app(FrameListSource(short_run(3)), mode="demo")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await settle(pilot, lambda: type(app.screen).__name__ == "HelpScreen")
        assert "stops the demo trainer" in plain(app.screen.query_one("#keys", Static).content)


async def test_the_alert_detail_scrolls_to_its_end_at_80x24() -> None:
    from textual.containers import VerticalScroll

    app = quiet(make_app(FrameListSource(exploding_run())))
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.query_one(AlertsPanel)
        await settle(pilot, lambda: bool(panel.entries))
        panel.focus()
        await pilot.press("enter")
        await settle(pilot, lambda: type(app.screen).__name__ == "AlertDetail")
        scroll = app.screen.query_one(VerticalScroll)
        await settle(pilot, lambda: scroll.max_scroll_y > 0)  # more than fits
        await pilot.press("end")
        await settle(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y)


async def test_a_live_heatmap_catches_up_with_the_run() -> None:
    """It redraws at most once a second; what comes in meanwhile is drawn then, even
    when the run falls silent just after."""
    from tests.tui.test_app import PacedSource

    app = quiet(make_app(PacedSource(deep_run(150, layers=4), every=5)))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("h")
        heat = app.query_one(GradHeatmapView)
        await settle(pilot, lambda: bool(heat.rows_text))
        await settle(pilot, lambda: heat.axis_text.split()[-1:] == ["149"], timeout=10)
