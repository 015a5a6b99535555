"""Text for the screen, from state (pure functions, tested without a terminal)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from probes.kernel.diagnosis import Severity, worst_severity
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.endings import RunEnd
from tui.resources import byte_size, slope_words
from tui.run import RunState
from tui.state import MonitorState
from tui.text import cut_words, plain_line, plain_name

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


def seconds_short(value: float | None) -> str:
    """A duration in at most six characters: ``850µs``, ``4.2ms``, ``23ms``, ``1.25s``;
    ``-`` for None."""
    if value is None or not math.isfinite(value):
        return "-"
    if value <= 0:
        return "0"
    if value < 1e-3:
        return f"{value * 1e6:.0f}µs"
    if value < 1e-2:
        return f"{value * 1e3:.1f}ms"
    if value < 1:
        return f"{value * 1e3:.0f}ms"
    return f"{value:.2f}s" if value < 100 else f"{value:.0f}s"


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


def run_ending(run: RunState) -> RunEnd | None:
    """How the run ended (None while it is connected)."""
    if run.connected:
        return None
    if run.ending is not None:
        return run.ending
    return RunEnd.of(run.end_reason if run.ended else None, run.disconnect_reason)


def connection_label(run: RunState, now: float | None = None) -> str:
    """``connected`` (``connected, quiet 42s`` when no frame came for a while and the
    run is not paused), ``probe off``, or how the run ended: ``finished``,
    ``interrupted``, ``error: TYPE: message``, ``exit status N``, ``killed`` (no bye),
    ``connection lost: why``, ``disconnected (why)`` (``probes.kernel.endings``)."""
    if run.probe_error:
        return "probe off"
    if run.connected:
        quiet = (time.monotonic() if now is None else now) - run.last_frame_at
        if quiet >= QUIET_AFTER_S and not run.control.get("paused") and run.last_frame_at:
            return f"connected, quiet {quiet:.0f}s"
        return "connected"
    ending = run_ending(run)
    return plain_line(ending.label) if ending is not None else "disconnected"


class StatusField(str):
    """One field of the status line: its text, the style it is shown in (chosen
    from the state it tells of, never read back from the text), and its ``role``
    (what it tells: ``fit_status`` drops fields by role, never by their words)."""

    style: str
    role: str

    def __new__(cls, text: str, style: str = "", role: str = "") -> StatusField:
        field = super().__new__(cls, text)
        field.style = style
        field.role = role
        return field


PROBE_COST_WARN = 0.05  # the probe's share of a step shown as a warning above this
CONNECTED_STYLE = "green"
GONE_STYLE = Severity.ERROR.style  # disconnected, the probe off, frames rejected
CONTROL_STYLE = "bold yellow"  # paused, or an anomaly step armed


def status_fields(
    run: RunState | None, monitor: MonitorState, listening: str, *, short: bool = False
) -> list[str]:
    """The status line's fields, most important first; ``short`` abbreviates them for
    a narrow terminal (``75.7/s``, ``alerts 2/3``, ``drop 0``), every one still there.
    Each is a ``StatusField``: its ``style`` says how to show it, its ``role`` what
    it is."""
    if run is None:
        return ["traintop", f"{'waiting' if short else 'waiting for a run'}: {listening}"]
    rate = run.steps_per_s
    if rate is None:
        speed = "-/s" if short else "- steps/s"
    elif short:
        speed = f"{rate:,.0f}/s" if rate >= 100 else f"{rate:.1f}/s"
    else:
        speed = f"{rate:,.1f} steps/s"
    fields: list[str] = [
        StatusField(plain_name(run.name), role="name"),
        StatusField(f"step {run.last_step:,}", role="step"),
        StatusField(speed, role="speed"),
        StatusField(f"loss {number(run.loss)}", role="loss"),
    ]
    control = StatusField(control_label(run), _control_style(run), "control")
    if short and run.connected and not run.probe_error:
        quiet = connection_label(run)
        fields.append(
            control
            if quiet == "connected"
            else StatusField(quiet.replace("connected, ", ""), role="connection")
        )
    elif short and not run.connected and not run.probe_error:
        text = _short_ending(run)
        fields.append(StatusField(text, _connection_style(run, text), "connection"))
    else:
        connection = connection_label(run)
        fields += [
            StatusField(connection, _connection_style(run, connection), "connection"),
            *([control] if run.connected else []),
        ]
    dropped = f"drop {run.dropped:,}" if short else f"dropped {run.dropped:,}"
    fields += [
        StatusField(alerts_label(run, short=short), _alerts_style(run), "alerts"),
        StatusField(
            dropped,
            Severity.WARNING.style if run.dropped else "",
            "dropped" if run.dropped else "dropped_none",
        ),
    ]
    fields += resource_fields(run)
    share = run.probe_share
    if share is not None:
        style = Severity.WARNING.style if share > PROBE_COST_WARN else ""
        fields.append(StatusField(f"probe {100 * share:.1f}%", style, "probe"))
    if monitor.rejected_frames:
        rejected = f"{'rej' if short else 'rejected'} {monitor.rejected_frames:,}"
        fields.append(StatusField(rejected, GONE_STYLE, "rejected"))
    if len(monitor.runs) > 1:
        fields.append(StatusField(f"{len(monitor.runs)} runs", role="runs"))
    return fields


#: The alerts that turn each resource field to the warning's style (the error's, for
#: the memory running out).
DATA_ALERTS = frozenset({AlertKind.INPUT_BOUND})
MEMORY_ALERTS = frozenset({AlertKind.MEMORY_CREEP, AlertKind.RETAINED_GRAPH})


def resource_fields(run: RunState) -> list[str]:
    """``data 23%`` (the data wait's share of the recent steps' cycle) and ``mem 3.1G
    +12M/step`` (the memory now, its recent slope a step), each when measured; a field
    whose alert is active on the run is shown in the warning's style and keeps its place
    longer (its role is ``data``/``memory``, not ``data_quiet``/``memory_quiet``)."""
    kinds = {alert.kind for alert in run.active_alerts}
    resources = run.resources
    fields: list[str] = []
    shares = resources.shares()
    if shares is not None:
        warn = not DATA_ALERTS.isdisjoint(kinds)
        text = f"data {100 * shares['data']:.0f}%"
        style = Severity.WARNING.style if warn else ""
        fields.append(StatusField(text, style, "data" if warn else "data_quiet"))
    memory = resources.memory_now
    if memory is not None:
        slope = resources.memory_slope()
        text = f"mem {byte_size(memory)}" + ("" if slope is None else f" {slope_words(slope)}")
        if AlertKind.OUT_OF_MEMORY in kinds:
            style = GONE_STYLE
        elif not MEMORY_ALERTS.isdisjoint(kinds):
            style = Severity.WARNING.style
        else:
            style = ""
        fields.append(StatusField(text, style, "memory" if style else "memory_quiet"))
    return fields


def _connection_style(run: RunState, label: str) -> str:
    """Green while connected and heard from, plain while quiet; the error's style when
    the probe is off; once gone, the style of how the run ended (``probes.kernel.endings``:
    a clean end is plain, an error or a lost connection is not)."""
    if run.probe_error:
        return GONE_STYLE
    if not run.connected:
        ending = run_ending(run)
        return ending.style if ending is not None else GONE_STYLE
    return CONNECTED_STYLE if label == "connected" else ""


def _control_style(run: RunState) -> str:
    control = run.control
    return CONTROL_STYLE if control.get("paused") or control.get("anomaly_armed") else ""


def _alerts_style(run: RunState) -> str:
    """The worst active alert's: an error's style, else a warning's (an info alert
    still asks for a look)."""
    worst = worst_severity(run.active_alerts)
    if worst is None:
        return ""
    return worst.style if worst is Severity.ERROR else Severity.WARNING.style


STATUS_SEPARATORS = (" │ ", "│")
#: Fields that give way, whole, in this order, when the abbreviated line is still too
#: wide: what the run list, the chart or a toast tells too, then the least asked for.
#: The run's name, its step, how it is connected (or ended, or its control) and its
#: alerts stay.
GIVE_WAY = (
    "probe",
    "runs",
    "dropped_none",
    "speed",
    "memory_quiet",
    "data_quiet",
    "rejected",
    "dropped",
    "loss",
    "memory",
    "data",
)


def fit_status(
    run: RunState | None, monitor: MonitorState, listening: str, width: int
) -> tuple[list[str], str]:
    """The status fields and separator that fit ``width`` columns, by rule; a field
    is shown whole or not at all (how the run ended and its name may be cut, with
    an ellipsis, at a word's end where one is near):

    1. full; 2. abbreviated (``status_fields(short=True)``); 3. tight separators;
    4. how the run ended cut (an error keeps ``error: TYPE:``), then the run's name
    (the run list shows it), to ``NAME_MIN``; 5. whole fields dropped in the order of
    ``GIVE_WAY`` (``probe N%``, ``N runs``, ``drop 0``, the speed, ...)."""
    choices = [
        (False, STATUS_SEPARATORS[0]),
        (True, STATUS_SEPARATORS[0]),
        (True, STATUS_SEPARATORS[1]),
    ]
    for short, separator in choices:
        fields = status_fields(run, monitor, listening, short=short)
        if width <= 0 or _width(fields, separator) <= width:
            return fields, separator
    over = _shorten_ending(fields, run, _width(fields, separator) - width)
    name = fields[0]
    if over > 0 and len(name) > NAME_MIN:
        keep = max(len(name) - over, NAME_MIN + 1)
        fields[0] = StatusField(cut_words(name, keep), "", "name")
    for role in GIVE_WAY:
        if _width(fields, separator) <= width:
            break
        fields = [field for field in fields if getattr(field, "role", "") != role]
    room = width - _width(fields, separator)  # what a dropped field left: to the name
    if room > 0 and fields[0] != name:
        fields[0] = StatusField(cut_words(name, len(fields[0]) + room), "", "name")
    return fields, separator


def _width(fields: list[str], separator: str) -> int:
    return len(separator.join(fields))


def _short_ending(run: RunState) -> str:
    """How the run ended, abbreviated: what its bye said (an error's message cut), or
    the monitor's verdict in a word (``killed``, ``connection lost``, ...)."""
    ending = run_ending(run)
    if ending is None:
        return "disconnected"
    if ending.ending.said_bye:
        return cut_words(plain_line(ending.label), ENDING_SHORT)
    return ending.ending.label


def _shorten_ending(fields: list[str], run: RunState | None, over: int) -> int:
    """Cut the field of how the run ended (in place) by up to ``over`` characters, to
    ``error: TYPE: …`` (else ``ENDING_MIN``) at least; return how many characters the
    line is still over."""
    ending = run_ending(run) if run is not None and not run.probe_error else None
    if ending is None:
        return over
    for index, field in enumerate(fields[1:], start=1):
        if getattr(field, "role", "") == "connection":
            parts = field.split(": ", 2)  # "error", its type, its message: the type stays
            least = len(parts[0]) + len(parts[1]) + 5 if len(parts) == 3 else ENDING_MIN
            shown = max(len(field) - over, min(len(field), least))
            text = cut_words(field, shown)
            fields[index] = StatusField(text, getattr(field, "style", ""), "connection")
            return over - (len(field) - len(text))
    return over


NAME_MIN = 8  # characters of a run's name the status line keeps at least
ENDING_SHORT = 60  # characters of how a run ended, abbreviated (an error's message)
ENDING_MIN = 24  # ... at least, when even that does not fit (an error keeps its type)


def control_label(run: RunState) -> str:
    """``running``, ``paused``, plus ``anomaly armed N`` and ``guard`` when on."""
    control = run.control
    label = "paused" if control.get("paused") else "running"
    if control.get("anomaly_armed"):
        label += f"+anomaly({control['anomaly_armed']})"
    if control.get("guard"):
        label += "+guard"
    return label


def alerts_label(run: RunState, *, short: bool = False) -> str:
    """``alerts 0`` when none was raised, else ``alerts 2 active / 3 raised`` (short:
    ``alerts 2/3``): the panel lists every raised one, cleared ones dimmed."""
    entries = run.raised_alerts  # (not those folded under a job's incident or cause)
    raised = len(entries)
    if not raised:
        return "alerts 0"
    active = sum(1 for entry in entries if entry.active)
    return f"alerts {active}/{raised}" if short else f"alerts {active} active / {raised} raised"


def validation_label(run: RunState) -> str | None:
    """``0.1587@100``: the latest validation loss and the step it was taken at."""
    validation = run.validation
    if validation is None or validation[1].latest is None:
        return None
    series = validation[1]
    return f"{number(series.latest)}@{int(series.latest_x or 0)}"


def downsample(xs: list[float], ys: list[float], limit: int) -> tuple[list[float], list[float]]:
    """At most ``limit`` evenly spaced points, always keeping the last one."""
    if len(xs) <= limit or limit < 2:
        return xs, ys
    stride = math.ceil((len(xs) - 1) / (limit - 1))
    idx = [*range(0, len(xs) - 1, stride), len(xs) - 1]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def run_label(run: RunState, *, ending: bool = True) -> str:
    """One line for a list of runs: connected or not, the name, the step, and (with
    ``ending``) how the run ended, in a word: ``finished``, ``error``, ``killed``, ..."""
    mark = "●" if run.connected else "○"
    ended = run_ending(run) if ending else None
    end = f"  {ended.ending.label}" if ended is not None else ""
    if run.job is not None:  # under its job's name: the rank says which
        return f"{mark} r{run.rank}  {run.last_step:,}{end}"
    return f"{mark} {plain_name(run.name)}  {run.last_step:,}{end}"


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
