"""The monitor's widgets; each draws from run state and holds none of its own."""

from tui.widgets.alerts_panel import AlertsPanel
from tui.widgets.heatmap import GradHeatmapView
from tui.widgets.layer_table import LayerTable
from tui.widgets.loss_chart import LossChart
from tui.widgets.ranks_panel import RanksPanel
from tui.widgets.run_list import RunList
from tui.widgets.status_line import StatusLine

__all__ = [
    "AlertsPanel",
    "GradHeatmapView",
    "LayerTable",
    "LossChart",
    "RanksPanel",
    "RunList",
    "StatusLine",
]
