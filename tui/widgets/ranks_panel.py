"""The job view: one line per rank of the selected run's job.

Per rank its host, step, loss, speed, how far it lags the furthest rank, its data wait
plus forward time a step (the straggler score: a job of up to ``LISTED_RANKS`` is listed
by it, highest first, where its ranks measure it), and how many records it sent; above
them the ranks' loss (median and spread) and the slowest rank.
A job of more ranks than ``LISTED_RANKS`` lists those that stand out first (gone,
quiet, a loss apart, behind: ``tui.jobs.ranks_view``), the shown rank and rank 0, and
one line for the others. Shown only for a run that is a rank of a multi-rank job;
``k`` picks the rank the other views show.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import DataTable

from tui.format import number, seconds_short
from tui.jobs import (
    LISTED_RANKS,
    QUIET_S,
    JobState,
    RankSummary,
    RestSummary,
    ranks_view,
)
from tui.run import RunState
from tui.state import MonitorState
from tui.text import plain_name

COLUMNS = (  # (label, width): 88 columns hold them all (a narrower table scrolls)
    ("rank", 4),
    ("host", 10),
    ("step", 8),
    ("loss", 9),
    ("steps/s", 7),
    ("lag", 5),
    ("in+fwd", 6),  # the straggler score: data wait plus forward, a step
    ("records", 7),
    ("state", 10),
)
MAX_ROWS = 5  # ranks shown at once (the table scrolls for more)
# A big job's lines are made at most this often: 1,024 ranks' took 40 ms a frame.
BIG_JOB_REDRAW_S = 1.0


class RanksPanel(DataTable[Text | str]):
    """The ranks of the selected run's job (hidden for a run on its own)."""

    DEFAULT_CSS = """
    RanksPanel {
        height: auto;
        max-height: 7;
        display: none;
        border-top: solid $panel;
    }
    RanksPanel.-job {
        display: block;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="none", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._shown: list[tuple[str, ...]] = []
        self._drawn_for: str | None = None  # the run shown at the last redraw, and when
        self._drawn_at = 0.0
        self._later = False  # a redraw of a big job waits on a timer
        self._latest: tuple[RunState, MonitorState] | None = None  # ... of this

    def _draw_latest(self) -> None:
        self._later = False
        if self._latest is not None:
            self.show(*self._latest)

    def on_mount(self) -> None:
        for label, width in COLUMNS:
            self.add_column(label, key=label, width=width)

    def rows_wanted(self, run: RunState | None, monitor: MonitorState) -> int:
        """Rows it takes for this run: 0 outside a job; its ranks (up to ``MAX_ROWS``),
        the header and the border otherwise."""
        job = job_of(run, monitor)
        return 0 if job is None else min(len(job.ranks), MAX_ROWS) + 2

    def show(self, run: RunState | None, monitor: MonitorState) -> None:
        """Redraw from the job's ranks (a job of more than ``LISTED_RANKS``: at most once
        a second, unless the rank shown changed)."""
        job = job_of(run, monitor)
        self.set_class(job is not None, "-job")
        if job is None or run is None:
            return
        now = time.monotonic()
        big = len(job.ranks) > LISTED_RANKS
        wait = self._drawn_at + BIG_JOB_REDRAW_S - now
        if big and run.run_id == self._drawn_for and wait > 0:
            # (a thousand ranks' numbers move faster than one reads them); what changed
            # meanwhile is drawn when the wait is over, even if nothing changes after
            self._latest = (run, monitor)
            if not self._later:
                self._later = True
                self.set_timer(wait, self._draw_latest)
            return
        self._drawn_for, self._drawn_at = run.run_id, now
        summary = job.summary(monitor.runs, now)
        self.border_title = Text(job_title(job, monitor, summary))  # (plain: a job's id)
        view = ranks_view(summary, run.run_id)
        rows = [
            rank_row(line, selected=line.run_id == run.run_id, why=why) for line, why in view.listed
        ]
        if view.rest is not None:
            rows.append(rest_row(view.rest))
        shown = [
            tuple(cell.plain if isinstance(cell, Text) else cell for cell in row) for row in rows
        ]
        if shown == self._shown:
            return
        self._shown = shown
        self.clear()
        for row in rows:
            self.add_row(*row)


def job_of(run: RunState | None, monitor: MonitorState) -> JobState | None:
    """The job the run is a rank of (None: a run on its own)."""
    if run is None or run.job is None:
        return None
    return monitor.jobs.get(run.job)


def job_title(job: JobState, monitor: MonitorState, summary: list[RankSummary]) -> str:
    """``job J: 4 of 4 ranks, loss 0.41 (spread 0.03), slowest r2 (lags 12)``."""
    parts = [f"job {plain_name(job.job_id)}: {len(summary):,} of {job.world_size:,} ranks"]
    spread = job.loss_spread(monitor.runs)
    if spread is not None:
        parts.append(f"loss {number(spread[0])} (spread {number(spread[1])})")
    live = [line for line in summary if line.connected]
    if len(live) > 1:
        slowest = max(live, key=lambda line: line.lag)
        if slowest.lag > 0:
            parts.append(f"slowest r{slowest.rank} (lags {slowest.lag:,})")
    return ", ".join(parts)


#: What the state cell says of a rank listed for standing out (``tui.jobs.ranks_view``).
WHY_LISTED = {"loss": "loss apart", "behind": "behind", "straggler": "straggler"}


def rank_row(line: RankSummary, *, selected: bool, why: str = "") -> tuple[Text | str, ...]:
    """One rank's cells; the rank the views show is marked; ``why``: what it stands out
    by, said in its state cell."""
    state = "connected" if line.connected else "gone"
    if line.connected and line.quiet_s >= QUIET_S:
        state = f"quiet {line.quiet_s:.0f}s"
    elif line.connected and why in WHY_LISTED:
        state = WHY_LISTED[why]
    style = "bold" if selected else ""
    return (
        Text(("▶" if selected else " ") + f"r{line.rank}", style=style),
        Text(plain_name(line.host)),
        f"{line.step:,}",
        number(line.loss),
        "-" if line.steps_per_s is None else f"{line.steps_per_s:.1f}",
        str(line.lag),
        seconds_short(line.straggle),
        f"{line.records:,}",
        Text(state, style="" if line.connected and why not in WHY_LISTED else "red"),
    )


def rest_row(rest: RestSummary) -> tuple[Text | str, ...]:
    """The ranks not listed, in one line: how many, their steps, median loss and speed,
    the most any lags, their records."""
    low, high = rest.steps
    return (
        Text("…", style="dim"),
        Text(f"{rest.count:,} more", style="dim"),
        f"{low:,}" if low == high else f"{low:,}+",
        "-" if rest.loss is None else number(rest.loss[0]),
        "-" if rest.steps_per_s is None else f"{rest.steps_per_s:.1f}",
        f"≤{rest.lag:,}",
        "",
        f"{rest.records:,}",
        Text("in step", style="dim"),
    )
