"""Text for the screen, from state (pure functions, tested without a terminal)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from tui.state import MonitorState, RunState

SPARK_BARS = "▁▂▃▄▅▆▇█"


def number(value: float | None, digits: int = 4) -> str:
    """A compact number: ``0.1234``, ``1.23e-05``, ``1.2e+03``, ``nan``, ``-`` for None."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e4:
        return f"{value:.{digits}g}"
    return f"{value:.{max(digits - 2, 1)}e}"


def sparkline(values: Sequence[float], width: int, *, log: bool = True) -> str:
    """A one-line bar chart of the last ``width`` values (log scale by default).

    Non-finite values show as ``!`` so they stand out.
    """
    if width <= 0:
        return ""
    tail = list(values)[-width:]
    finite = [_scale(v, log) for v in tail if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return "".join("!" if not math.isfinite(v) else " " for v in tail)
    low, high = min(finite), max(finite)
    span = high - low
    out = []
    for value in tail:
        if not math.isfinite(value):
            out.append("!")
        elif log and value <= 0:
            out.append(SPARK_BARS[0])
        else:
            level = 0.5 if span == 0 else (_scale(value, log) - low) / span
            out.append(SPARK_BARS[min(int(level * len(SPARK_BARS)), len(SPARK_BARS) - 1)])
    return "".join(out)


def _scale(value: float, log: bool) -> float:
    return math.log10(value) if log else value


QUIET_AFTER_S = 10.0  # a connected run silent this long may be hung (or in a long eval)


def connection_label(run: RunState, now: float | None = None) -> str:
    """``connected`` (``connected, quiet 42s`` when no frame came for a while and the
    run is not paused), ``finished``, ``disconnected (why)`` or ``probe off``."""
    if run.probe_error:
        return "probe off"
    if run.connected:
        quiet = (time.monotonic() if now is None else now) - run.last_frame_at
        if quiet >= QUIET_AFTER_S and not run.control.get("paused") and run.last_frame_at:
            return f"connected, quiet {quiet:.0f}s"
        return "connected"
    if run.ended:
        return "finished"
    return f"disconnected ({run.disconnect_reason})" if run.disconnect_reason else "disconnected"


def status_fields(run: RunState | None, monitor: MonitorState, listening: str) -> list[str]:
    """The status line's fields, most important first."""
    if run is None:
        return ["traintop", f"waiting for a run: {listening}"]
    rate = run.steps_per_s
    fields = [
        run.name,
        f"step {run.last_step:,}",
        f"{rate:,.1f} steps/s" if rate is not None else "- steps/s",
        f"loss {number(run.loss)}",
        connection_label(run),
        *([control_label(run)] if run.connected else []),
        alerts_label(run),
        f"dropped {run.dropped:,}",
    ]
    if monitor.rejected_frames:
        fields.append(f"rejected {monitor.rejected_frames:,}")
    if len(monitor.runs) > 1:
        fields.append(f"{len(monitor.runs)} runs")
    return fields


def control_label(run: RunState) -> str:
    """``running``, ``paused``, plus ``anomaly armed N`` and ``guard`` when on."""
    control = run.control
    label = "paused" if control.get("paused") else "running"
    if control.get("anomaly_armed"):
        label += f"+anomaly({control['anomaly_armed']})"
    if control.get("guard"):
        label += "+guard"
    return label


def alerts_label(run: RunState) -> str:
    """``alerts 0``, or ``alerts 3 (1 error)`` counting the active ones."""
    active = run.active_alerts
    errors = sum(1 for a in active if a.severity == "error")
    return f"alerts {len(active)}" + (f" ({errors} error{'s' * (errors != 1)})" if errors else "")


def downsample(xs: list[float], ys: list[float], limit: int) -> tuple[list[float], list[float]]:
    """At most ``limit`` evenly spaced points, always keeping the last one."""
    if len(xs) <= limit or limit < 2:
        return xs, ys
    stride = math.ceil((len(xs) - 1) / (limit - 1))
    idx = [*range(0, len(xs) - 1, stride), len(xs) - 1]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def run_label(run: RunState) -> str:
    """One line for the run list."""
    mark = "●" if run.connected else "○"
    return f"{mark} {run.name}  {run.last_step:,}"


def axis_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """``count`` evenly spaced tick positions from ``low`` to ``high``."""
    if count < 2 or high <= low:
        return [low]
    step = (high - low) / (count - 1)
    return [low + i * step for i in range(count)]


def wants_log_scale(values: list[float], decades: float = 1.5) -> bool:
    """True when positive values span more than ``decades`` orders of magnitude."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if len(positive) < 2:
        return False
    return math.log10(max(positive) / min(positive)) > decades
