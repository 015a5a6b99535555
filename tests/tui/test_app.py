"""The monitor screen, driven by Textual's Pilot with frames from a fake source."""

from __future__ import annotations

import asyncio

from probes.kernel.wire import FrameError
from tests.frames import LAYERS, exploding_run, hello, short_run, step
from tests.waiting import settle
from tui.app import make_app
from tui.sources import FrameListSource
from tui.widgets import LayerTable, LossChart, RunList, StatusLine


class PacedSource:
    """Frames delivered over time, a few at a time, as a live socket does."""

    description = "paced frames"

    def __init__(self, frames: list, every: int) -> None:
        self.frames, self.every = frames, every

    async def run(self, monitor) -> None:
        from tui.server import Connection

        conn = Connection(0, "paced", None)
        for index, frame in enumerate(self.frames):
            monitor.frame_received(conn, frame)
            if index % self.every == 0:
                await asyncio.sleep(0.005)  # the pace of a live socket (not a wait)


async def test_frames_show_in_status_chart_and_layer_table() -> None:
    app = make_app(FrameListSource(short_run(30)))
    async with app.run_test(size=(120, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "step 29" in status.text)
        assert status.text.startswith("mlp")
        assert "100.0 steps/s" in status.text  # from the frames' own clock
        assert "dropped 0" in status.text
        chart = app.query_one(LossChart)
        assert len(chart.plotted["train loss"]) == 30
        assert len(chart.plotted["validation (val_loss)"]) == 3
        table = app.query_one(LayerTable)
        assert table.row_count == len(LAYERS)
        head = table.row_text("head")
        assert head[0] == "head"
        assert head[1] == "0.99"  # 0.5 + 0.1 * 2 + 0.01 * 29: the latest grad norm
        assert head[3] == "7"  # param norm from the last sampled step (20)
        assert len(head[2].strip()) > 10  # a sparkline of the recent history


async def test_non_finite_values_are_shown_as_such() -> None:
    frames = [*short_run(5), step(5, loss=float("nan"), grad_norms=[1.0, float("inf"), None])]
    app = make_app(FrameListSource(frames))
    async with app.run_test(size=(100, 30)) as pilot:
        chart = app.query_one(LossChart)
        await settle(pilot, lambda: chart.first_non_finite is not None)
        assert chart.first_non_finite == 5
        row = app.query_one(LayerTable).row_text("encoder.2")
        assert row[1] == "inf"
        assert app.query_one(LayerTable).row_text("head")[1] == "none"
        assert "loss nan" in app.query_one(StatusLine).text


async def test_several_runs_get_a_run_list_and_r_switches() -> None:
    frames = [*short_run(10, run="run-a", name="first"), *short_run(20, run="run-b", name="second")]
    app = make_app(FrameListSource(frames))
    async with app.run_test(size=(120, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "2 runs" in status.text)
        assert app.query_one(RunList).has_class("-several")
        assert status.text.startswith("first")
        await pilot.press("r")
        await settle(pilot, lambda: status.text.startswith("second"))
        assert "step 19" in status.text


async def test_rejected_frames_are_counted_not_fatal() -> None:
    frames = [*short_run(3), FrameError("malformed frame: boom"), step(3)]
    app = make_app(FrameListSource(frames))
    async with app.run_test() as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "step 3" in status.text)
        assert "rej 1" in status.text  # 80 columns (run_test's size): abbreviated
        assert app.state.last_rejection == "malformed frame: boom"


async def test_views_redraw_at_frame_rate_not_per_record(monkeypatch) -> None:
    draws = 0
    original = LossChart.show

    def counting_show(self, run):
        nonlocal draws
        draws += 1
        return original(self, run)

    monkeypatch.setattr(LossChart, "show", counting_show)  # before the app exists
    app = make_app(PacedSource(short_run(300), every=10))
    async with app.run_test() as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "step 299" in status.text, timeout=10)
    assert app.state.version > 300  # every record was applied...
    assert 0 < draws < 60  # ...but the chart drew a few times a second, not per record


async def test_q_quits() -> None:
    app = make_app(FrameListSource(short_run(3)))
    async with app.run_test() as pilot:
        await pilot.press("q")
        await settle(pilot, lambda: app.return_code is not None)
    assert app.return_code == 0


def test_ema_is_bias_corrected_and_smooths() -> None:
    from tui.widgets.loss_chart import ema

    assert ema([2.0], 0.9) == [2.0]  # no pull towards zero at the start
    smoothed = ema([1.0, 3.0] * 50, 0.9)
    assert abs(smoothed[-1] - 2.0) < 0.2  # the alternation averages out
    assert max(smoothed[50:]) - min(smoothed[50:]) < 0.5


async def test_s_toggles_smoothing_of_the_train_loss() -> None:
    app = make_app(FrameListSource(short_run(30)))
    async with app.run_test(size=(120, 40)) as pilot:
        chart = app.query_one(LossChart)
        await settle(pilot, lambda: len(chart.plotted.get("train loss", [])) == 30)
        smoothed = chart.plotted["train loss"]
        await pilot.press("s")
        await settle(pilot, lambda: chart.plotted["train loss"] != smoothed)
        raw = chart.plotted["train loss"]
        assert raw[-1] == 1 / 30  # the last loss as logged (linear: under 1.5 decades)
        assert smoothed[-1] > raw[-1]  # the average lags a falling loss


def plain(renderable: object) -> str:
    """What a Rich renderable (text, table) shows, as plain text."""
    import io

    from rich.console import Console

    console = Console(width=110, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


async def test_alert_detail_shows_evidence_and_next_experiments() -> None:
    from textual.widgets import Static

    from tui.screens.alert_detail import AlertDetail
    from tui.widgets import AlertsPanel

    app = make_app(FrameListSource(exploding_run()))
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(AlertsPanel)
        await settle(pilot, lambda: bool(panel.entries))
        assert panel.entries[0].alert.kind == "exploding_gradient"
        assert "alerts 1/1" in app.query_one(StatusLine).text  # abbreviated to fit
        assert app.query_one(LayerTable).row_text("encoder.2")[5] == "exploding"
        panel.focus()
        await pilot.press("enter")
        await settle(pilot, lambda: isinstance(app.screen, AlertDetail))
        texts = {w.id: plain(w.content) for w in app.screen.query(Static) if w.id}
        assert "exploding_gradient" in texts["title"] and "encoder.2" in texts["title"]
        assert "grad norm        100" in texts["evidence"] and "growth" in texts["evidence"]
        assert "does not say why" in texts["signal"]
        assert "1. Lower the learning rate alone" in texts["experiments"]
        await pilot.press("escape")
        await settle(pilot, lambda: not isinstance(app.screen, AlertDetail))


async def test_alert_markers_on_the_chart_step_axis() -> None:
    from tui.widgets.loss_chart import _alert_markers

    app = make_app(FrameListSource(exploding_run()))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: bool(app.current_run and app.current_run.alerts))
        assert _alert_markers(app.current_run) == [(11, "red")]  # 100x its window low


async def test_l_cycles_the_loss_scale() -> None:
    frames = [*short_run(3)] + [step(i, loss=10.0**-i) for i in range(3, 9)]  # 8 decades
    app = make_app(FrameListSource(frames))
    async with app.run_test(size=(120, 40)) as pilot:
        chart = app.query_one(LossChart)
        await settle(pilot, lambda: len(chart.plotted.get("train loss", [])) == 9)
        await pilot.press("s")  # raw values: the smoothed ones span fewer decades
        await settle(pilot, lambda: not chart.smoothing)
        await settle(pilot, lambda: max(chart.plotted["train loss"]) <= 0)  # auto: log10
        assert chart.scale == "auto"
        await pilot.press("l")
        await settle(pilot, lambda: chart.scale == "log")
        assert min(chart.plotted["train loss"]) == -8
        await pilot.press("l")
        await settle(pilot, lambda: chart.scale == "linear")
        await settle(pilot, lambda: max(chart.plotted["train loss"]) == 1.0)  # raw
        await pilot.press("l")
        await settle(pilot, lambda: chart.scale == "auto")


async def test_a_flood_of_bad_frames_makes_few_toasts() -> None:
    frames = [*short_run(3), *(FrameError(f"bad line {i}") for i in range(500))]
    app = make_app(FrameListSource(frames))
    async with app.run_test(size=(120, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "rejected 500" in status.text)  # all counted
        toasts = [n for n in app._notifications if n.title == "frame rejected"]
        assert len(toasts) == 1  # the rest held back


async def test_an_anomaly_report_from_history_does_not_pop_up() -> None:
    from probes.kernel.wire import make_frame
    from tui.screens.anomaly_report import AnomalyReportScreen

    report = make_frame(
        "anomaly", run="run-a", step=2, outcome="clean", duration=0.01, time=1000.0, seq=1
    )
    for replayed, pops_up in ((True, False), (False, True)):
        frame = {**report, "replayed": True} if replayed else report
        app = make_app(FrameListSource([*short_run(3), frame]))
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(
                pilot,
                lambda app=app: bool(app.current_run and app.current_run.anomaly_reports),
            )
            if pops_up:
                await settle(pilot, lambda app=app: isinstance(app.screen, AnomalyReportScreen))
            else:
                await pilot.pause(0.1)  # the point: no screen pops up meanwhile
                assert not isinstance(app.screen, AnomalyReportScreen)


async def test_a_model_with_thousands_of_layers_fills_rows_as_they_scroll_into_view() -> None:
    from tests.frames import hello

    names = [
        f"backbone.stage{i // 100}.block{i % 100}.attention.output.dense.projection.{i}"
        for i in range(2000)
    ]
    frames = [hello(layers=names), step(0, grad_norms=[float(i) for i in range(2000)], layers=2000)]
    app = make_app(FrameListSource(frames))
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(LayerTable)
        await settle(pilot, lambda: table.row_count == 2000 and table.row_text(names[0])[1] != "-")
        first = table.row_text(names[0])[0]
        assert len(first) == 40 and first.startswith("backbone") and first.endswith(".0")
        assert table.row_text(names[-1])[1] == "-"  # off screen: not drawn yet
        table.scroll_end(animate=False)
        await settle(pilot, lambda: table.row_text(names[-1])[1] == "1999")


def vanishing_stack_run() -> list:
    """Four layers, the first three vanishing from step 0; tiny updates on them at the
    sampled steps (folded under the vanishing gradient, not raised)."""
    layers = ["l0", "l1", "l2", "l3"]
    frames = [hello(layers=layers)]
    for i in range(60):
        frame = step(i, grad_norms=[1e-9, 1e-8, 1e-7, 1.0], layers=4)
        if i % 20 == 0:
            frame["update_ratios"] = [1e-9, 1e-9, 1e-9, 1e-3]
        frames.append(frame)
    return frames


async def test_an_incident_shows_its_layers_and_what_folded_under_it() -> None:
    from textual.widgets import Static

    from tui.screens.alert_detail import AlertDetail
    from tui.widgets import AlertsPanel

    app = make_app(FrameListSource(vanishing_stack_run()))
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(AlertsPanel)
        await settle(pilot, lambda: bool(panel.entries and panel.entries[0].alert.folded))
        assert [e.alert.kind for e in panel.entries] == ["vanishing_gradient"]
        row = [str(cell) for cell in panel.get_row_at(0)]
        assert row[3] == "l0 +2" and row[4].startswith("+1 folded: update_ratio")
        table = app.query_one(LayerTable)
        assert [table.row_text(name)[5] for name in ("l0", "l1", "l2", "l3")] == [
            "vanishing",
            "vanishing",
            "vanishing",
            "",
        ]
        panel.focus()
        await pilot.press("enter")
        await settle(pilot, lambda: isinstance(app.screen, AlertDetail))
        texts = {w.id: plain(w.content) for w in app.screen.query(Static) if w.id}
        assert "Layers (3, the first failing first): l0, l1, l2" in texts["incident"]
        assert "update_ratio at step 40" in texts["incident"]


async def test_the_probes_automatic_check_is_said_in_a_toast_not_pushed_over_the_screen() -> None:
    from probes.kernel.wire import make_frame
    from tui.screens.anomaly_report import AnomalyReportScreen

    report = make_frame(
        "anomaly",
        run="run-a",
        step=2,
        outcome="non_finite_backward",
        backward_op="SqrtBackward0",
        module_of_backward_op="blocks.4",
        duration=0.01,
        time=1000.0,
        seq=1,
        auto={"armed_by": 1, "cost": "one step"},
    )
    app = make_app(FrameListSource([*short_run(3), report]))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: bool(app.current_run and app.current_run.anomaly_reports))
        await settle(pilot, lambda: any("automatic check" in n.message for n in app._notifications))
        assert not isinstance(app.screen, AnomalyReportScreen)
        [toast] = [n.message for n in app._notifications if "automatic check" in n.message]
        assert "blocks.4" in toast and "SqrtBackward0" in toast and "v: the report" in toast
        await pilot.press("v")  # the report is one key away
        await settle(pilot, lambda: isinstance(app.screen, AnomalyReportScreen))


def _with_grad_max(frames: list, every: int = 10) -> list:
    """``frames`` whose sampled steps (every ``every``th) carry each layer's largest
    gradient element, as a probe measures it."""
    for frame in frames:
        if frame["kind"] == "step" and frame["step"] % every == 0:
            frame["grad_max"] = [0.125 * (i + 1) + frame["step"] / 1000 for i in range(3)]
    return frames


async def test_the_largest_element_shows_once_measured_where_the_table_has_room() -> None:
    app = make_app(FrameListSource(_with_grad_max(short_run(30))))
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(LayerTable)
        await settle(pilot, lambda: table.row_count == 3 and len(table.row_text("head")) == 7)
        await settle(pilot, lambda: table.row_text("head")[6] == "0.395")  # sampled step 20
        assert table.row_text("head")[3] == "7"  # the others where they were


async def test_no_largest_element_column_for_a_run_that_does_not_measure_it() -> None:
    app = make_app(FrameListSource(short_run(30)))
    async with app.run_test(size=(120, 40)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: "step 29" in status.text)
        table = app.query_one(LayerTable)
        assert [len(table.row_text(name)) for name in LAYERS] == [6, 6, 6]
