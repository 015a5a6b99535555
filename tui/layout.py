"""How the main screen shares its rows (pure: a function of sizes and counts).

At 80x24 a fixed split starves someone: the alerts panel showed its header alone, the
chart two rows. ``plan_rows`` gives the chart a readable minimum, then the alerts
(when there are any, they come before the layer table: they say where to look), and
the per-layer view (table or heatmap) the rest; rows nobody needs go to the chart.
"""

from __future__ import annotations

from dataclasses import dataclass

CHART_MIN = 10  # title, frame, axis and border take 5 rows: this leaves 5 for curves
CHART_SHARE = 0.45  # of the rows, when there are enough
ALERT_ROWS_MAX = 12  # alert lines shown at most (the panel scrolls for more)
ALERTS_CHROME = 1  # the panel's header
TABLE_MIN = 3  # the layer table's header and two layers
TABLE_CHROME = 1  # the table's header
HEATMAP_CHROME = 2  # the heatmap's legend and step axis


@dataclass(frozen=True)
class Rows:
    """Rows given to each view of the main screen (0: hidden)."""

    chart: int
    alerts: int
    layers: int


def plan_rows(height: int, *, alerts: int, layers: int, heatmap: bool = False) -> Rows:
    """Share ``height`` rows (the screen less the status line and footer).

    Args:
        height: rows for the views.
        alerts: alert lines the panel lists (0: it says "no alerts" on one line).
        layers: the run's layers (rows of the table or the heatmap).
        heatmap: the heatmap is shown instead of the layer table: it needs its rows to
            be read at all, so the chart gives way to it, down to hidden.
    """
    height = max(height, 0)
    alerts_wanted = ALERTS_CHROME + min(max(alerts, 1), ALERT_ROWS_MAX)
    if heatmap:
        alerts_rows = min(alerts_wanted, max(height // 3, ALERTS_CHROME + 1))
        remaining = max(height - alerts_rows, 0)
        heat = min(layers + HEATMAP_CHROME, remaining)
        chart = remaining - heat
        if chart < CHART_MIN:  # too short to read: the heatmap takes its rows
            heat, chart = remaining, 0
        return Rows(chart=chart, alerts=alerts_rows, layers=heat)
    chart = min(max(CHART_MIN, round(height * CHART_SHARE)), height)
    rest = height - chart
    alerts_rows = min(alerts_wanted, max(rest - TABLE_MIN, 0))
    table = min(layers + TABLE_CHROME, rest - alerts_rows)
    return Rows(chart=chart + rest - alerts_rows - table, alerts=alerts_rows, layers=table)


WIDE_MIN = 140  # columns from which the time and memory charts stand beside the loss chart
RESOURCE_SHARE = 0.4  # ... of the chart row's columns
RESOURCE_ROWS_MIN = 2 * CHART_MIN  # ... and rows the row must have (both charts readable)


def resource_columns(width: int, chart_rows: int, *, measured: bool) -> int:
    """Columns the time and memory charts take beside the loss chart (0: not shown):
    only for a run that measures its step time or memory, on a wide terminal
    (``WIDE_MIN``), where the chart row is tall enough; at 80x24 the status line alone
    tells of them."""
    if not measured or width < WIDE_MIN or chart_rows < RESOURCE_ROWS_MIN:
        return 0
    return round(width * RESOURCE_SHARE)
