"""The ? screen: every key, and what the controls do to the run."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.screens.panel import PanelScreen

KEYS = (
    ("p", "pause the run at the next step boundary, or resume it"),
    ("n", "while paused: run exactly one step"),
    (
        "a",
        "run the next step under torch.autograd.detect_anomaly (3a: the next three);"
        " while paused, it runs now",
    ),
    ("v", "view the last anomaly report"),
    ("c", "view the reports of the data and batch checks (check_split, ...)"),
    ("g", "guard on/off: non-finite gradients skip optimizer.step() and pause (one sync a step)"),
    ("-  +", "learning-rate experiment: scale every group's LR by 0.5 or 2 (asks first)"),
    ("enter", "on an alert: its evidence, what it signals and the next experiments"),
    ("l  s", "loss chart: scale (auto, log, linear), smoothing of the train loss"),
    ("h", "per-layer view: the table, or a heatmap of log10 grad norm over the whole run"),
    ("m", "compare runs: losses overlaid, per-layer grad-norm ratios to a reference"),
    ("r", "next run (several runs connected)"),
    ("k", "pick the rank: the next rank of a multi-rank job (the views start on rank 0)"),
    ("tab", "move between the alerts and the layer table"),
    ("?", "this help (escape closes it, and every screen over the main one)"),
)
#: What q does, which depends on how the monitor was started.
QUIT = {
    "live": "quit: the monitor detaches; the run goes on untouched (a monitor started "
    "later on the same address sees it again, from step 0)",
    "run": "quit: the monitor detaches and the script trains on; traintop prints its log "
    "file and the command that watches it again (from step 0). Started with "
    "--stop-on-quit: q stops it (SIGINT). If it has ended: its output is printed",
    "demo": "quit: stops the demo trainer too (it is the demo's child)",
    "replay": "quit (a replay touches no run)",
}
#: What X does: stop the script of traintop run; nothing elsewhere.
STOP = {
    "run": "stop the script: asks first, then sends SIGINT, as Ctrl-C would (asked "
    "again while it still runs: SIGTERM); the monitor stays",
}
NO_SCRIPT = "under traintop run: stop its script (asks first); here there is none"
LIVE_ONLY = ("p", "n", "a", "g", "-  +")  # commands to a live run: none in a replay


def keys_for(mode: str) -> list[tuple[str, str]]:
    """The key table as true for ``mode`` (``live``, ``run``, ``demo`` or ``replay``)."""
    keys = list(KEYS)
    if mode == "replay":
        keys.append(
            ("", f"{' '.join(LIVE_ONLY)}: commands to a live run (a replay has none to take them)")
        )
    return [
        *keys,
        ("X", STOP.get(mode, NO_SCRIPT)),
        ("q", QUIT.get(mode, QUIT["live"])),
        ("ctrl+c", "the same as q"),
    ]


class HelpScreen(PanelScreen):
    """The keys of the monitor."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen > VerticalScroll {
        max-width: 100;
    }
    HelpScreen Static {
        margin-bottom: 0;
    }
    """

    def __init__(self, mode: str = "live") -> None:
        super().__init__()
        self.mode = mode

    def compose(self) -> ComposeResult:
        table = Table(
            title="traintop keys",
            box=None,
            show_header=False,
            padding=(0, 2, 0, 0),
            title_justify="left",
        )
        table.add_column("key", style="bold cyan")
        table.add_column("does")
        for key, does in keys_for(self.mode):
            table.add_row(key, does)
        with VerticalScroll():
            yield Static(table, id="keys")
