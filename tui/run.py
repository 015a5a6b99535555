"""One run as the monitor knows it: pure data, no widgets, no I/O.

``RunState`` takes a run's frames (``MonitorState`` routes them) and keeps its curves,
per-layer values, alerts and control state; widgets draw from it.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from probes.kernel.diagnosis import Alert, AlertChange, Diagnoser, RunInfo
from probes.kernel.diagnosis.book import MAX_ALERTS, AlertBook, AlertEntry
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.endings import RunEnd
from probes.kernel.schema import EvalView, StepView, validation_loss_name
from probes.kernel.schema.floats import Float32List
from probes.kernel.wire import Frame
from tui.heatmap import GradHeatmap
from tui.resources import RunResources
from tui.series import BucketedSeries

_Value = TypeVar("_Value")

SPARK_HISTORY = 48  # grad-norm values kept per layer for the sparkline
RATE_WINDOW = 32  # step records used to estimate steps per second
PROBE_COST_WINDOW = 64  # step records over which the probe's share of a step is taken


__all__ = ["MAX_ALERTS", "AlertEntry", "RunState"]

# The layer table's condition of each layer an active alert of these kinds concerns.
LAYER_CONDITIONS: dict[str, str] = {
    AlertKind.VANISHING_GRADIENT: "vanishing",
    AlertKind.EXPLODING_GRADIENT: "exploding",
    AlertKind.DEAD_ACTIVATIONS: "dead",
    AlertKind.SATURATED_ACTIVATIONS: "dead",
}


@dataclass
class RunState:
    """Everything the monitor knows about one run; its alerts are its ``book``'s."""

    run_id: str
    name: str = "?"
    info: RunInfo = field(default_factory=RunInfo)  # what its hello said
    layers: list[str] = field(default_factory=list)
    param_counts: list[int] = field(default_factory=list)
    connected: bool = False
    ended: bool = False  # said bye
    end_reason: str = ""  # what the bye said: "closed", "interrupted", "error: ..."
    last_frame_at: float = 0.0  # time.monotonic() of the run's latest frame, here
    gone_at: float = 0.0  # time.monotonic() when its connection ended (0: never yet)
    disconnect_reason: str = ""  # the ending's label (``ending``), once gone
    ending: RunEnd | None = None  # how the run ended, once gone (None: connected)
    last_step: int = -1
    step_records: int = 0
    dropped: int = 0
    scalars: dict[str, BucketedSeries] = field(default_factory=dict)
    eval_scalars: dict[str, BucketedSeries] = field(default_factory=dict)
    grad_total: BucketedSeries = field(default_factory=BucketedSeries)
    grad_norms: list[float | None] = field(default_factory=list)
    # The latest records' per-layer grad norms, one list per record (one append a record,
    # not one per layer: the monitor takes thousands of records a second).
    grad_records: deque[Sequence[float | None]] = field(
        default_factory=lambda: deque(maxlen=SPARK_HISTORY)
    )
    grad_max: list[float | None] = field(default_factory=list)  # per layer, sampled
    param_norms: list[float | None] = field(default_factory=list)
    update_ratios: list[float | None] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    none_grads: int = 0
    events: deque[Frame] = field(default_factory=lambda: deque(maxlen=500))
    book: AlertBook = field(default_factory=AlertBook)
    control: dict[str, Any] = field(default_factory=dict)  # paused, anomaly_armed, guard
    anomaly_reports: list[Frame] = field(default_factory=list)
    check_reports: list[Frame] = field(default_factory=list)
    probe_error: str = ""  # set when the probe switched itself off
    last_seq: dict[str, int] = field(default_factory=dict)
    _recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    heatmap: GradHeatmap = field(default_factory=lambda: GradHeatmap(0))
    resources: RunResources = field(default_factory=RunResources)  # step time, memory
    # (probe_time, duration) of recent step records that carry the probe's own time
    _probe_cost: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=PROBE_COST_WINDOW)
    )

    def grad_history(self, layer: int) -> list[float]:
        """A layer's latest gradient norms (for its sparkline), oldest first."""
        return [
            value
            for norms in self.grad_records
            if layer < len(norms) and (value := norms[layer]) is not None
        ]

    @property
    def job(self) -> str | None:
        """The job its ranks share (None: a run on its own, or a job of one rank)."""
        return self.info.job

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def alerts(self) -> list[AlertEntry]:
        """Every alert entry of the run, oldest first (its book's)."""
        return self.book.entries

    @property
    def diagnoser(self) -> Diagnoser:
        """The run's diagnosis (its book's)."""
        return self.book.diagnoser

    @property
    def steps_per_s(self) -> float | None:
        """Training speed over the recent step records, by the run's own clock."""
        if len(self._recent) < 2:
            return None
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        if t1 <= t0:
            return None
        return (s1 - s0) / (t1 - t0)

    @property
    def probe_share(self) -> float | None:
        """The probe's own time as a share of the step's, over the recent records
        (sums, so a thinned record weighs as the steps it stands for); None when the
        records do not carry ``probe_time``."""
        if not self._probe_cost:
            return None
        spent = sum(cost for cost, _ in self._probe_cost)
        total = sum(duration for _, duration in self._probe_cost)
        return spent / total if total > 0 else None

    @property
    def loss(self) -> float | None:
        series = self.scalars.get("loss")
        return None if series is None else series.latest

    @property
    def validation(self) -> tuple[str, BucketedSeries] | None:
        """The validation loss's name and series (``probes.kernel.schema`` picks the name)."""
        name = validation_loss_name(self.eval_scalars)
        return None if name is None else (name, self.eval_scalars[name])

    @property
    def active_alerts(self) -> list[Alert]:
        """The alerts raised and holding (not those folded under a job's incident)."""
        return self.book.active

    @property
    def raised_alerts(self) -> list[AlertEntry]:
        """Every alert raised for the run, one per root cause (a rank's alert folded under
        its job's incident is shown there, not here)."""
        return self.book.raised

    def why_gone(self, connection_reason: str) -> str:
        """Why the run is gone, kept as ``ending``: "finished" after a clean bye, else what
        the bye said (an error, an interrupt), else what happened to the connection
        ("killed": closed with no bye); returns the ending's label."""
        self.ending = RunEnd.of(self.end_reason if self.ended else None, connection_reason)
        return self.ending.label

    def layer_status(self) -> dict[str, str]:
        """Layer name -> its worst current condition, for colouring the layer table:
        ``non_finite``, ``exploding``, ``vanishing``, ``none_grad`` or ``dead``."""
        status: dict[str, str] = {}
        for i, name in enumerate(self.layers):
            grad = self.grad_norms[i] if i < len(self.grad_norms) else None
            if grad is None and self.step_records:
                status[name] = "none_grad"
            elif grad is not None and not math.isfinite(grad):
                status[name] = "non_finite"
        feeding = {
            name: self.layers[index]
            for (name, _), index in zip(
                self.info.activations, self.info.activation_layers, strict=True
            )
            if index is not None and 0 <= index < len(self.layers)
        }
        rank = {"dead": 0, "none_grad": 1, "vanishing": 2, "exploding": 3, "non_finite": 4}
        for alert in self.active_alerts:
            kind = LAYER_CONDITIONS.get(alert.kind)
            if not kind:
                continue
            # an incident names every layer it concerns (a dead ReLU: the layer feeding it)
            layers = alert.layers or (
                feeding.get(alert.subject, alert.subject) if kind == "dead" else alert.subject,
            )
            for layer in layers:
                if layer in self.layers and rank[kind] > rank.get(status.get(layer, ""), -1):
                    status[layer] = kind
        return status

    def apply_hello(self, info: RunInfo) -> None:
        """The run said hello (again, on a reconnect): what it is, its layers, its
        control state now."""
        self.info = info
        self.name = self.run_id if info.name is None else info.name
        layers = list(info.layers)
        if layers != self.layers:
            self.layers = layers
            self.grad_norms = [None] * len(layers)
            self.grad_max = [None] * len(layers)
            self.param_norms = [None] * len(layers)
            self.update_ratios = [None] * len(layers)
            self.grad_records.clear()
            self.heatmap = GradHeatmap(len(layers))
        self.param_counts = list(info.param_counts)
        self.control.update(info.control)  # paused now, or not
        if not self.step_records:  # a new run (not a reconnect): diagnose from its start
            self.book.start(info)
        self.connected = True
        self.ended = False
        self.end_reason = ""
        self.disconnect_reason = ""
        self.ending = None

    def apply_step(self, view: StepView) -> bool:
        """Take a step record (parsed: ``probes.kernel.schema``); False if it was already seen
        (a replay on reconnect)."""
        step = view.step
        if step <= self.last_step:
            return False
        self.last_step = step
        self.step_records += 1
        self.dropped = view.dropped or self.dropped
        self._recent.append((view.time, step))
        self._note_probe_cost(view.probe_time, view.duration)
        self.resources.apply(view)
        for name, value in view.scalars.items():
            self._series(self.scalars, name).append(step, value)
        if view.grad_norm_total is not None:
            self.grad_total.append(step, view.grad_norm_total)
        self._apply_layer_values(view)
        self.learning_rates = _shared(view.lrs)
        self.none_grads = view.none_grads
        return True

    def _note_probe_cost(self, probe_time: float | None, duration: float | None) -> None:
        if probe_time is None or duration is None:
            return
        if math.isfinite(probe_time) and math.isfinite(duration) and duration > 0:
            self._probe_cost.append((max(probe_time, 0.0), duration))

    def apply_eval(self, view: EvalView) -> None:
        for name, value in view.scalars.items():
            self._series(self.eval_scalars, name).append(view.step, value)

    def _apply_layer_values(self, view: StepView) -> None:
        count = len(self.layers)
        grads = view.grad_norms
        if len(grads) == count and count:
            self.grad_norms = norms = _shared(grads)
            # Kept as 8 bytes a value, not a float object each (32 with its pointer): a
            # monitor of 1,024 ranks holds 48 records of each. Read packed, the norms
            # come as float32 already (4 bytes, nothing to convert or scan).
            if type(grads) is Float32List:
                kept: Sequence[float | None] = grads.packed
            else:
                kept = norms if None in norms else array("d", cast("list[float]", norms))
            self.grad_records.append(kept)
            self.heatmap.add(view.step, grads, first_step=view.first_step)
        grad_max = view.more_layers.get("grad_max")
        if grad_max is not None and len(grad_max) == count:
            self.grad_max = _shared(grad_max)
        if view.param_norms is not None and len(view.param_norms) == count:
            self.param_norms = _shared(view.param_norms)
        if view.update_ratios is not None and len(view.update_ratios) == count:
            self.update_ratios = _shared(view.update_ratios)

    def diagnose(self, view: StepView | EvalView) -> list[AlertChange]:
        """Run the diagnosis rules on a step or eval record; its book keeps what they
        raise and clear."""
        return self.book.observe(view)

    def finish_diagnosis(self) -> list[AlertChange]:
        """The run ended: what the diagnoser still held back (a consequence that waited
        for a cause that never came)."""
        return self.book.finish(self.last_step)

    @staticmethod
    def _series(table: dict[str, BucketedSeries], name: str) -> BucketedSeries:
        series = table.get(name)
        if series is None:
            series = table[name] = BucketedSeries()
        return series


def _shared(values: Sequence[_Value]) -> list[_Value]:
    """A record's per-layer list as the run keeps it: the record's own list (a record
    is never changed once read, and its views share its lists already), not a copy of
    it; one a record of each rank, at a thousand ranks, kept the collector busy."""
    return values if isinstance(values, list) else list(values)
