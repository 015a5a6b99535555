"""The list of runs, shown when more than one run has connected."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tui.format import run_ending, run_label
from tui.run import RunState
from tui.state import MonitorState
from tui.text import plain_name


class RunList(OptionList):
    """Pick the run the other views show."""

    DEFAULT_CSS = """
    RunList {
        width: 24;
        height: 1fr;
        display: none;
    }
    RunList.-several {
        display: block;
    }
    """

    def show(self, monitor: MonitorState, selected: str | None) -> None:
        """Redraw from the monitor's runs: a job's ranks together under its name."""
        # several entries (runs, or jobs): one job alone has its ranks panel instead
        jobs = {run.job for run in monitor.runs.values() if run.job in monitor.jobs}
        entries = len(jobs) + sum(1 for run in monitor.runs.values() if run.job not in jobs)
        self.set_class(entries > 1, "-several")
        if entries <= 1:  # hidden: a job of 1,024 ranks made its lines in 90 ms a frame
            return
        items = list_items(monitor)
        ids = [item_id for item_id, _, _ in items]
        if ids != [self.get_option_at_index(i).id for i in range(self.option_count)]:
            self.set_options(
                Option(label, id=item_id, disabled=header) for item_id, label, header in items
            )
        else:
            for item_id, label, _ in items:
                self.replace_option_prompt(item_id, label)
        if selected in ids:
            index = ids.index(selected)
            if self.highlighted != index:
                self.highlighted = index


def list_items(monitor: MonitorState) -> list[tuple[str, Text, bool]]:
    """(option id, label, is a job's header) for each line of the list, in the order runs
    arrived; a job's header (its name and world size) comes before its ranks."""
    items: list[tuple[str, Text, bool]] = []
    listed: set[str] = set()
    for run in monitor.runs.values():
        if run.run_id in listed:
            continue
        job = monitor.jobs.get(run.job) if run.job else None
        if job is None:
            items.append((run.run_id, run_text(run, monitor.told_apart(run)), False))
            listed.add(run.run_id)
            continue
        mark = monitor.job_told_apart(job)  # (plain text, as the name)
        header = Text(
            f"{plain_name(job.name)}{f' {mark}' if mark else ''} [{job.world_size} ranks]"
        )
        items.append((f"job:{job.job_id}", header, True))
        for member in job.rank_runs(monitor.runs):
            items.append((member.run_id, run_text(member, indent="  "), False))
            listed.add(member.run_id)
    return items


def run_text(run: RunState, mark: str | None = None, indent: str = "") -> Text:
    """A run's entry, as plain text (its name is the run's own); under it, what tells it
    apart from the runs of its name (``mark``: when it started, or where it runs) and
    how the run ended, in its ending's colour."""
    label = Text(indent + run_label(run, ending=False))
    ending = run_ending(run)
    if mark is None and ending is None:
        return label
    label.append(f"\n{indent}  ")
    if mark is not None:
        label.append(mark + ("  " if ending else ""), style="dim")
    if ending is not None:
        label.append(ending.ending.label, style=ending.style)
    return label
