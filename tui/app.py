"""The Textual monitor: status line, loss chart, per-layer table, run list."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, OptionList

from probes.kernel.commands import Command
from tui import toasts
from tui.dispatch import dispatch, handles
from tui.events import (
    AckReceived,
    AlertRaised,
    AnomalyReported,
    FrameRejected,
    MonitorEvent,
    ProbeSwitchedOff,
    RunConnected,
    RunDisconnected,
)
from tui.layout import plan_rows
from tui.monitor import Monitor
from tui.run import RunState
from tui.screens.alert_detail import AlertDetail
from tui.screens.anomaly_report import AnomalyReportScreen
from tui.screens.checks import ChecksScreen
from tui.screens.compare import ComparePicker, CompareScreen
from tui.screens.confirm import Confirm
from tui.screens.confirm_stop import StoppableScript, ask_to_stop
from tui.screens.help import HelpScreen
from tui.sources import FrameSource
from tui.state import MonitorState
from tui.terminal import HangupSafeDriver, Leaving, TerminalWatch
from tui.text import plain_name
from tui.widgets import (
    AlertsPanel,
    GradHeatmapView,
    LayerTable,
    LossChart,
    RanksPanel,
    RunList,
    StatusLine,
)
from tui.widgets.alerts_panel import sorted_alerts
from tui.widgets.resource_charts import ResourceViews

FRAME_RATE_HZ = 8  # views redraw at most this often, whatever the record rate
REPLAY_NOT_LIVE = "replay: the run is not live"  # what a command key says in a replay


class TraintopApp(App[int]):
    """Watch training runs live (or replay a recorded one).

    Args:
        source: where frames come from (a ``ServerSource``, a ``ReplaySource``, or
            a ``FrameListSource`` in tests).
        record_path: append every received frame to this run log.
        script: the script of ``traintop run``, which ``X`` stops (asked first).
        mode: ``live`` (a socket), ``run`` (q leaves the script running), ``demo`` (q
            stops the trainer) or ``replay``; the help says what q does in each.
        compare_on_start: open the comparison of every run at once (``traintop replay
            a.ndjson b.ndjson``).
    """

    CSS_PATH = "app.tcss"
    TITLE = "traintop"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        # ? comes second: the footer drops the keys that do not fit from the right, and
        # the help is the one key that finds the others.
        Binding("question_mark", "help", "Help"),
        # Ctrl-C quits as q does, as in most terminal monitors (Textual's own binding
        # only says "press ctrl+q"); a priority binding: no widget takes it for a copy.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        # Enter opens an alert whatever has the focus (the layer table, the run list,
        # whose own Enter did nothing their cursor does not): on the main screen only
        # (check_action); a modal screen's Enter is its own.
        Binding("enter", "open_alert", "Alert", show=False, priority=True),
        Binding("p", "pause_resume", "Pause/resume"),
        Binding("n", "single_step", "Step"),
        Binding("a", "anomaly_step", "Anomaly step"),
        Binding("g", "toggle_guard", "Guard"),
        Binding("minus", "scale_lr(0.5)", "LR x0.5", show=False),
        Binding("plus,equals_sign", "scale_lr(2.0)", "LR x2", show=False),
        Binding("v", "view_anomaly", "Report", show=False),
        Binding("c", "view_checks", "Checks", show=False),
        Binding("l", "toggle_log_scale", "Log", show=False),
        Binding("s", "toggle_smoothing", "Smooth", show=False),
        Binding("h", "toggle_heatmap", "Heatmap"),
        Binding("m", "compare", "Compare", show=False),
        Binding("r", "next_run", "Next run", show=False),
        Binding("k", "next_rank", "Next rank", show=False),
        Binding("X", "stop_script", "Stop script"),  # traintop run only (check_action)
    ]

    selected_run: reactive[str | None] = reactive(None, init=False)
    count_prefix: reactive[int] = reactive(0)  # typed digits before a key, e.g. 3a

    def __init__(
        self,
        source: FrameSource,
        *,
        record_path: str | None = None,
        state: MonitorState | None = None,
        companion: Callable[[], int | None] | None = None,
        script: StoppableScript | None = None,
        mode: str = "live",
        compare_on_start: bool = False,
    ) -> None:
        super().__init__()
        # what the screen is written through, and what ends it from outside (signals,
        # a terminal that hung up)
        self.terminal = TerminalWatch()
        self._leaving = Leaving(self.terminal, lambda code: self.exit(return_code=code))
        self.script = script
        self.source = source
        self.mode = mode
        self.compare_on_start = compare_on_start
        self.heatmap_shown = False
        self._heights: dict[str, int] = {}  # rows given to each view, as last set
        self.companion = companion  # the demo trainer's exit status, None while it runs
        self._companion_reported = False
        self.monitor = Monitor(state, record_path=record_path, on_events=self._on_monitor_events)
        self._drawn_version = -1
        self._status_drawn_at = 0.0
        self._gate = toasts.ToastGate()  # alerts' and rejected frames' toasts, few

    @property
    def state(self) -> MonitorState:
        return self.monitor.state

    @property
    def current_run(self) -> RunState | None:
        """The run the views show."""
        if self.selected_run is None:
            return None
        return self.state.runs.get(self.selected_run)

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Horizontal(id="body"):
            yield RunList(id="runs")
            with Vertical(id="views"):
                yield RanksPanel(id="ranks")
                with Horizontal(id="charts"):
                    yield LossChart(id="loss")
                    yield ResourceViews(id="resources")
                yield AlertsPanel(id="alerts")
                yield LayerTable(id="layers")
                yield GradHeatmapView(id="heatmap")
        yield Footer()

    def on_mount(self) -> None:
        self._leaving.install()
        self.feed()
        self.set_interval(1 / FRAME_RATE_HZ, self.redraw)
        self.set_interval(1.0, self.monitor.tick)  # ranks gone quiet, held alerts
        self.set_interval(1.0, self._leaving.check_terminal)
        if self.companion is not None:
            self.set_interval(0.5, self._check_companion)
        self.redraw()
        if self.compare_on_start:
            self.push_screen(CompareScreen(self.state))

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver for this platform; on Linux, one that writes through the
        app's ``TerminalWatch`` (``tui.terminal``)."""
        driver_class = super().get_driver_class()
        return HangupSafeDriver if driver_class is LinuxDriver else driver_class

    def on_unmount(self) -> None:
        self._leaving.remove()
        self.monitor.close()

    def on_resize(self) -> None:
        self.call_after_refresh(self.redraw, True)  # once the views have their new sizes

    def _check_companion(self) -> None:
        status = self.companion() if self.companion else None
        if status not in (None, 0) and not self._companion_reported:
            self._companion_reported = True
            who = "the script" if self.mode == "run" else "the demo trainer"
            self.notify(
                f"{who} exited with status {status}; its log is printed when you quit",
                severity="error",
                timeout=30,
            )

    @work(exclusive=True, group="source", exit_on_error=False, name="source")
    async def feed(self) -> None:
        """Run the frame source; its failure (e.g. cannot listen) ends the app."""
        try:
            await self.source.run(self.monitor)
        except Exception as exc:  # shown as one line, never a traceback on screen
            self.exit(return_code=1, message=f"traintop: {exc}")

    def redraw(self, force: bool = False) -> None:
        """Redraw every view from state, if anything changed since the last frame."""
        with contextlib.suppress(NoMatches):  # the app is closing: its views are gone
            self._redraw(force)

    def _redraw(self, force: bool) -> None:
        now = time.monotonic()
        # Every tick, not only on new data: what a view needs can change without it
        # (a table's columns widen as its cells fill, and a scroll bar appears).
        self._lay_out(self.current_run)
        if not force and self.state.version == self._drawn_version:
            if now - self._status_drawn_at >= 1.0:  # a silent run ages on screen
                self._status_drawn_at = now
                self.query_one(StatusLine).show(
                    self.current_run, self.state, self.source.description
                )
            return
        self._drawn_version = self.state.version
        self._status_drawn_at = now
        run = self.current_run
        self.query_one(StatusLine).show(run, self.state, self.source.description)
        self.query_one(RunList).show(self.state, self.selected_run)
        self.query_one(RanksPanel).show(run, self.state)
        if self.query_one("#charts").display:
            self.query_one(LossChart).show(run)
            self.query_one(ResourceViews).show(run)
        self.query_one(LayerTable).show(run)
        self.query_one(GradHeatmapView).show(run)
        self.query_one(AlertsPanel).show(run)

    def _lay_out(self, run: RunState | None) -> None:
        """Share the rows between the views (``tui.layout``), for this run and size."""
        views = self.query_one("#views")
        chart, table = self.query_one("#charts"), self.query_one(LayerTable)
        panel = self.query_one(AlertsPanel)
        # a table wider than its room has a horizontal scroll bar: one more row
        scroll_bar = int(table.virtual_size.width > table.size.width > 0)
        panel_bar = int(panel.virtual_size.width > panel.size.width > 0)
        ranks_rows = self.query_one(RanksPanel).rows_wanted(run, self.state)
        shown_alerts = len(sorted_alerts(run.alerts)) if run else 0  # (not those folded)
        rows = plan_rows(
            (views.size.height or self.size.height - 2) - ranks_rows,
            alerts=shown_alerts + panel_bar if shown_alerts else 0,
            layers=(len(run.layers) if run else 0) + scroll_bar,
            heatmap=self.heatmap_shown,
        )
        heat = self.query_one(GradHeatmapView)
        chart.display = rows.chart > 0
        if self.query_one(ResourceViews).fit(run, self.size.width, rows.chart):
            self.call_after_refresh(self.redraw, True)
        table.display, heat.display = not self.heatmap_shown, self.heatmap_shown
        for widget, height in (
            (chart, rows.chart),
            (panel, rows.alerts),
            (heat if self.heatmap_shown else table, rows.layers),
        ):
            if height and self._heights.get(widget.id or "") != height:
                self._heights[widget.id or ""] = height
                widget.styles.height = height
                self.call_after_refresh(self.redraw, True)  # fitted to the new size

    def _on_monitor_events(self, events: list[MonitorEvent]) -> None:
        dispatch(events, self)  # to the @handles methods below (tui.dispatch)

    @handles(RunConnected)
    def handle_run_connected(self, event: RunConnected) -> None:
        if self.state.takes_the_view(event.run, self.current_run):  # (never from a live run)
            self.selected_run = event.run.run_id
        self._show(toasts.run_connected(event))

    @handles(RunDisconnected)
    def handle_run_disconnected(self, event: RunDisconnected) -> None:
        self._show(toasts.run_disconnected(event))

    @handles(FrameRejected)
    def handle_frame_rejected(self, event: FrameRejected) -> None:
        self._show(toasts.frame_rejected(event), topic="rejected")

    @handles(AckReceived)
    def handle_ack_received(self, event: AckReceived) -> None:
        if event.run.run_id == self.selected_run:  # (a job's ranks all ack: one toast)
            self._show(toasts.ack_received(event))

    @handles(AnomalyReported)
    def handle_anomaly_reported(self, event: AnomalyReported) -> None:
        live = not event.report.get("replayed")  # not an old one, sent on connect
        if not (self._shown_or_its_job(event.run) and live):
            return
        if event.report.get("auto"):  # the probe's own check: said, not pushed over
            self._show(toasts.automatic_check(event))
        elif not isinstance(self.screen, AnomalyReportScreen):
            self.push_screen(AnomalyReportScreen(event.report))

    @handles(ProbeSwitchedOff)
    def handle_probe_switched_off(self, event: ProbeSwitchedOff) -> None:
        self._show(toasts.probe_switched_off(event))

    @handles(AlertRaised)
    def handle_alert_raised(self, event: AlertRaised) -> None:
        if self._shown_or_its_job(event.run):
            self._show(toasts.alert_raised(event), topic="alert")

    def _shown_or_its_job(self, run: RunState) -> bool:
        """The run the views show, or another rank of its job."""
        shown = self.current_run
        return shown is not None and (
            shown.run_id == run.run_id or (run.job is not None and shown.job == run.job)
        )

    def _show(self, toast: toasts.Toast, *, topic: str | None = None) -> None:
        """A toast as plain text (it holds a run's own words), never markup; one of a
        ``topic`` at most every ``toasts.TOAST_GAP_S`` (``toasts.ToastGate``)."""
        message = toast.message
        if topic is not None:
            held = self._gate.admit(topic, time.monotonic())
            if held is None:
                return
            message += f" (and {held} more)" if held else ""
        self.notify(
            message,
            title=toast.title,
            severity=toast.severity,
            timeout=toast.timeout,
            markup=False,
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "open_alert":  # Enter is a modal screen's own (a picker, a question)
            return self.screen is self.screen_stack[0]
        if action == "stop_script":  # hidden with no script of traintop run's
            return self.script is not None and self.screen is self.screen_stack[0]
        return True

    @on(DataTable.RowSelected, "#alerts")  # (a click on an alert)
    def _alert_clicked(self) -> None:
        self.action_open_alert()

    def action_open_alert(self) -> None:
        """Open the alert under the alerts panel's cursor (the first, if none is)."""
        panel = self.query_one(AlertsPanel)
        entry = panel.selected() or (panel.entries[0] if panel.entries else None)
        if entry is None:
            self.notify("no alert to open", timeout=2)
            return
        self.push_screen(AlertDetail(entry))

    def watch_selected_run(self) -> None:
        self.redraw(force=True)

    @on(OptionList.OptionSelected, "#runs")
    @on(OptionList.OptionHighlighted, "#runs")
    def _pick_run(self, event: OptionList.OptionSelected | OptionList.OptionHighlighted) -> None:
        if event.option.id is not None:
            self.selected_run = event.option.id

    # --- taking the wheel ------------------------------------------------------------

    def on_key(self, event: events.Key) -> None:
        if (
            event.character is not None
            and event.character.isdigit()
            and (self.screen is self.screen_stack[0])
        ):
            self.count_prefix = min(self.count_prefix * 10 + int(event.character), 999)
            event.stop()

    def _live(self) -> bool:
        """True if commands can reach a run; in a replay, says why not (the footer
        offers the keys all the same)."""
        if self.mode == "replay":
            self.notify(REPLAY_NOT_LIVE, severity="warning", timeout=3)
            return False
        return True

    def _command(self, command: Command, **args: object) -> None:
        if not self._live():
            return
        run = self.current_run
        if run is None:
            self.notify("no run selected", severity="warning")
            return
        problem = self.monitor.send_command(run.run_id, command, **args)
        if problem:
            self.notify(problem, severity="warning", markup=False)

    def action_pause_resume(self) -> None:
        run = self.current_run
        paused = bool(run and run.control.get("paused"))
        self._command(Command.RESUME if paused else Command.PAUSE)

    def action_single_step(self) -> None:
        self._command(Command.STEP)

    def action_anomaly_step(self) -> None:
        count, self.count_prefix = max(self.count_prefix, 1), 0
        self._command(Command.ANOMALY, count=count)

    def action_toggle_guard(self) -> None:
        run = self.current_run
        self._command(Command.GUARD, on=not bool(run and run.control.get("guard")))

    def action_scale_lr(self, factor: float) -> None:
        run = self.current_run
        if run is None or not self._live():
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._command(Command.LR_SCALE, factor=factor)

        lrs = ", ".join(f"{x:.3g}" for x in run.learning_rates) or "?"
        self.push_screen(
            Confirm(
                f"Scale the learning rate of {plain_name(run.name)} by {factor:g}?\n"
                f"Now: {lrs}. The change is marked on the loss chart; a "
                "scheduler in the loop may set it again."
            ),
            answered,
        )

    def action_stop_script(self) -> None:
        if self.script is not None:  # (hidden otherwise: check_action)
            ask_to_stop(self, self.script)

    def action_view_anomaly(self) -> None:
        run = self.current_run
        if run is None or not run.anomaly_reports:
            self.notify("no anomaly report yet: press a to run a step under anomaly mode")
            return
        self.push_screen(AnomalyReportScreen(run.anomaly_reports[-1]))

    def action_view_checks(self) -> None:
        run = self.current_run
        self.push_screen(ChecksScreen(run.check_reports if run else []))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.mode))

    def action_toggle_heatmap(self) -> None:
        self.heatmap_shown = not self.heatmap_shown
        self.redraw(force=True)

    def action_compare(self) -> None:
        if len(self.state.runs) < 2:
            self.notify(
                "comparing needs two runs or more: replay several run logs "
                "(traintop replay a.ndjson b.ndjson) or connect another run",
                severity="warning",
            )
            return

        def picked(run_ids: list[str] | None) -> None:
            if run_ids:
                self.push_screen(CompareScreen(self.state, run_ids))

        self.push_screen(ComparePicker(self.state, self.selected_run), picked)

    def action_toggle_log_scale(self) -> None:
        chart = self.query_one(LossChart)
        chart.cycle_scale()
        self.notify(f"loss scale: {chart.scale}", timeout=2)
        self.redraw(force=True)

    def action_toggle_smoothing(self) -> None:
        chart = self.query_one(LossChart)
        chart.smoothing = not chart.smoothing
        self.redraw(force=True)

    def action_next_rank(self) -> None:
        """Show the next rank of the selected run's job (the layer table, the chart)."""
        run = self.current_run
        job = self.state.jobs.get(run.job) if run is not None and run.job else None
        if job is None or run is None:
            self.notify("this run is not a rank of a multi-rank job", timeout=3)
            return
        ranks = sorted(job.ranks)
        following = ranks[(ranks.index(run.rank) + 1) % len(ranks)]
        self.selected_run = job.ranks[following]

    def action_next_run(self) -> None:
        ids = list(self.state.runs)
        if not ids:
            return
        index = ids.index(self.selected_run) if self.selected_run in ids else -1
        self.selected_run = ids[(index + 1) % len(ids)]


#: Build the monitor app around a frame source (injected, so tests need no socket).
make_app = TraintopApp
