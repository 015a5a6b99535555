"""The list of runs, shown when more than one run has connected."""

from __future__ import annotations

from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tui.format import run_label
from tui.state import MonitorState


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
        """Redraw from the monitor's runs."""
        runs = list(monitor.runs.values())
        self.set_class(len(runs) > 1, "-several")
        ids = [run.run_id for run in runs]
        if ids != [self.get_option_at_index(i).id for i in range(self.option_count)]:
            self.set_options(Option(run_label(run), id=run.run_id) for run in runs)
        else:
            for run in runs:
                self.replace_option_prompt(run.run_id, run_label(run))
        if selected in ids:
            index = ids.index(selected)
            if self.highlighted != index:
                self.highlighted = index
