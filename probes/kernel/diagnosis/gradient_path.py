"""Rung 4, the gradient path: norms by layer, missing gradients, dead or saturated
activations. Each rule raises one alert for however many layers, naming the first
failing one (the first to fail, then the first in the model) and listing the others."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import (
    Findings,
    Rule,
    Streaks,
    first_failing,
    ordered_range,
    reached_at,
    spread,
)
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, RunInfo, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.schema import INPUT_SUFFIX


class ExplodingGradient(Rule):
    """A layer's gradient norm above an absolute bound, or grown by a large factor over
    the last few steps; names the layer that crossed first (the peak of a record that
    stands for several steps counts).

    The bound gives way to the run's own scale: a run already above it at its first
    record, with a loss at least as large as its total norm (a loss summed over pixels
    has gradients in the thousands from step 0), is judged against
    ``exploding_start_factor`` times its first norms once its loss has fallen by
    ``exploding_start_drop`` within ``exploding_start_steps`` (it trains at that
    scale); a run whose loss has not by then is held to the absolute bound again (data
    in raw units: a mean loss in the tens of thousands that does not move).
    Gradients still multiplied by a GradScaler's scale are not judged at all
    (``grads_still_scaled`` says so)."""

    kind: str = AlertKind.EXPLODING_GRADIENT
    severity: Severity = Severity.ERROR

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        # The last records' per-layer norms, kept whole (step, peaks, shown): the
        # common step, every layer below the bounds, then costs no work per layer.
        self._recent: deque[tuple[int, Sequence[float | None], Sequence[float | None]]] = deque()
        self._total: deque[tuple[int, float]] = deque()
        self._crossed: dict[int, tuple[int, float, float]] = {}  # layer -> (step, norm, x)
        # The run's own scale: its first record's norms and loss; ``_own_scale`` is
        # False (the absolute bound), None (above it from the start, not yet judged) or
        # True (it trains at that scale: bounds relative to the first norms).
        self._own_scale: bool | None = False
        self._start: Sequence[float | None] = ()
        self._start_total: float | None = None
        self._start_loss: float | None = None
        self._seen = False
        self._start_step = 0
        self._start_over: list[int] = []  # layers above the bound at the first record

    def _growth(self, window: deque[tuple[int, float]], value: float, first: int) -> float:
        while window and window[0][0] < first - self.t.exploding_window:
            window.popleft()
        low = min((v for _, v in window), default=0.0)
        return value / low if low > 0 else 1.0

    def _layer_growth(self, layer: int, value: float) -> float:
        """``value`` over the layer's low in the recent window (its finite norms: the
        norm shown for a record, or its peak when that is not finite)."""
        low = math.inf
        for _, peaks, shown in self._recent:
            peak = peaks[layer] if layer < len(peaks) else None
            if peak is None or not math.isfinite(peak):
                continue
            norm = shown[layer] if layer < len(shown) else None
            low = min(low, norm if norm is not None and math.isfinite(norm) else peak)
        return value / low if 0 < low < math.inf else 1.0

    def _over(self, value: float, growth: float, bound: float) -> bool:
        return value > bound or (
            growth >= self.t.exploding_growth and value > self.t.exploding_growth_floor
        )

    def _bound(self, start: float | None) -> float:
        """The absolute bound, or at the run's own scale ``exploding_start_factor``
        times its first norm (``start``), whichever is higher."""
        if self._own_scale is False or start is None or not math.isfinite(start):
            return self.t.exploding_norm
        return max(self.t.exploding_norm, self.t.exploding_start_factor * start)

    def _note_scale(self, history: RecentPast, view: StepView) -> None:
        """The run's first record sets its scale; judge, within the first steps, whether
        a run above the bound from the start trains at that scale."""
        if not self._seen:
            self._seen = True
            total = view.peak_total
            peaks = view.peak_grads
            above = (total is not None and total > self.t.exploding_norm) or any(
                g is not None and g > self.t.exploding_norm for g in peaks
            )
            loss = view.loss_estimate
            # the loss's scale explains them: no larger than the loss itself (a mean
            # loss of 2 with a gradient of 500 is not a summed loss's scale)
            explained = total is not None and loss is not None and 0 < total <= loss
            if above and explained:
                self._own_scale = None
                self._start_step = view.first
                self._start_over = [
                    i for i, g in enumerate(peaks) if g is not None and g > self.t.exploding_norm
                ]
                self._start = list(peaks)
                self._start_total = total
                self._start_loss = view.loss_estimate
            return
        if self._own_scale is not None:
            return
        began = self._start_loss
        now = history.smoothed_loss(view.step, self.t.smoothing_steps)
        if began is None or not began > 0:
            self._own_scale = False  # no loss to judge it by: the bound holds
        elif now is not None and now <= (1 - self.t.exploding_start_drop) * began:
            self._own_scale = True
        elif view.step >= self.t.exploding_start_steps:
            self._own_scale = False

    def _held_since_start(self) -> None:
        """The run was not at its own scale after all: the layers above the bound at its
        first record have been over it since then (named so, first failing first)."""
        for i in self._start_over:
            peak = self._start[i]
            if peak is not None:
                self._crossed[i] = (self._start_step, peak, 1.0)

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.grads_scaled is not None:
            return []  # norms times a GradScaler's scale: not this rule's to read
        undecided = self._own_scale is None
        self._note_scale(history, view)
        judged = undecided and self._own_scale is False  # held to the bound from now
        if judged:
            self._held_since_start()
        start = self._start
        # Growth matters only above its floor (and the bound alone above that): most
        # norms are below both, and need no look at the window.
        floor = min(self.t.exploding_growth_floor, self.t.exploding_norm)
        oldest = view.first - self.t.exploding_window
        while self._recent and self._recent[0][0] < oldest:
            self._recent.popleft()
        peaks = view.peak_grads
        high = [
            i
            for i, peak in enumerate(peaks)
            if peak is not None and peak > floor and math.isfinite(peak)
        ]
        for i in list(self._crossed):  # back below the floor: no longer crossed
            peak = peaks[i] if i < len(peaks) else None
            if peak is not None and math.isfinite(peak) and peak <= floor:
                del self._crossed[i]
        for i in high:
            peak = peaks[i]
            assert peak is not None
            growth = self._layer_growth(i, peak)
            if self._over(peak, growth, self._bound(start[i] if i < len(start) else None)):
                self._crossed.setdefault(i, (view.step, peak, growth))
            else:
                self._crossed.pop(i, None)
        if judged:  # (even those back below the floor now: over it since the start)
            self._held_since_start()
            self._start_over = []
        self._recent.append((view.step, peaks, view.grad_norms))
        total = view.peak_total
        total_growth = 1.0
        if total is not None and math.isfinite(total):
            total_growth = self._growth(self._total, total, view.first)
            self._total.append((view.step, total))
        if self._crossed:
            since = {i: crossed[0] for i, crossed in self._crossed.items()}
            order = first_failing(since)
            step, norm, growth = self._crossed[order[0]]
            names = [history.info.layer(i) for i in order]
            return [
                self.alert(
                    view.step,
                    names[0],
                    {
                        "grad_norm": norm,
                        "growth": growth,
                        "since_step": step,
                        "grad_norm_total": total if total is not None else math.nan,
                        "layers_over": len(order),
                        **_range(names, history.info.layers),
                        **self._scale_evidence(),
                    },
                    layers=names,
                )
            ]
        if (
            total is not None
            and math.isfinite(total)
            and self._over(total, total_growth, self._bound(self._start_total))
        ):
            return [
                self.alert(
                    view.step,
                    "total",
                    {"grad_norm_total": total, "growth": total_growth, **self._scale_evidence()},
                )
            ]
        return []

    def _scale_evidence(self) -> dict[str, float]:
        """For a run above the bound from its first record: that record's total."""
        if self._start_total is None:
            return {}
        return {"first_grad_norm_total": self._start_total}


def _range(names: Sequence[str], order: Sequence[str]) -> dict[str, str]:
    if len(names) < 2:
        return {}
    ordered = ordered_range(names, order)
    return {"range": f"{ordered[0]}..{ordered[-1]}"}


class VanishingGradient(Rule):
    """Layers whose gradients stay tiny next to the largest layer's or to their own
    weights, for many steps in a row (the largest value of a record's span counts)."""

    kind: str = AlertKind.VANISHING_GRADIENT

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streaks = Streaks()
        self._last_params: Sequence[float | None] | None = None

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.param_norms is not None:
            self._last_params = view.param_norms
        peaks = view.peak_grads
        finite = [g for g in peaks if g is not None and math.isfinite(g)]
        weights = self._last_params or ()
        if len(finite) < 2 and self._last_params is None:
            return []
        largest = max(finite, default=0.0)
        several = len(finite) >= 2
        t = self.t
        streaks = self._streaks.since  # the loop runs per layer and per record: inlined
        ratios: dict[int, tuple[float, float, float]] = {}
        reached: dict[int, int] = {}
        for i, norm in enumerate(peaks):
            if norm is None or not math.isfinite(norm):
                if streaks:
                    streaks.pop(i, None)
                continue
            to_largest = norm / largest if largest > 0 else 1.0
            weight = weights[i] if i < len(weights) else None
            to_weight = norm / weight if weight else math.inf
            tiny = (several and to_largest < t.vanishing_to_largest) or (
                to_weight < t.vanishing_to_weight
                and (not several or to_largest < t.vanishing_to_largest_with_weight)
            )
            if not tiny:
                if streaks:
                    streaks.pop(i, None)
                continue
            since = streaks.setdefault(i, view.first)
            if reached_at(since, t.vanishing_steps, view) is not None:
                reached[i] = since
                ratios[i] = (norm, to_largest, to_weight)
        if not reached:
            return []
        order = first_failing(reached)
        first = order[0]
        names = [history.info.layer(i) for i in order]
        norm, to_largest, to_weight = ratios[first]
        step = reached_at(reached[first], self.t.vanishing_steps, view)
        assert step is not None
        return [
            self.alert(
                step,
                names[0],
                {
                    "grad_norm": norm,
                    "to_largest_layer": to_largest,
                    "to_weight_norm": to_weight,
                    "steps": view.step - reached[first] + 1,
                    **spread(ordered_range(names, history.info.layers)),
                },
                layers=names,
            )
        ]


class NoneGradients(Rule):
    """Trainable parameters whose ``.grad`` stays None after backward."""

    kind: str = AlertKind.NONE_GRADIENTS

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._since: int | None = None
        self._missing: tuple[int, ...] = ()

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        missing = tuple(view.none_grad_params)
        if not missing or missing != self._missing:
            self._since = view.first if missing else None
        self._missing = missing
        if self._since is None:
            return []
        step = reached_at(self._since, self.t.none_grad_steps, view)
        if step is None:
            return []
        params = history.info.params
        names = [params[i] if i < len(params) else f"param {i}" for i in missing]
        layers = list(dict.fromkeys(_layer_of(name) for name in names))
        return [
            self.alert(
                step,
                layers[0],
                {
                    "params": len(names),
                    "names": ", ".join(names[:6]),
                    "steps": view.step - self._since + 1,
                    **spread(ordered_range(layers, history.info.layers)),
                },
                layers=layers,
            )
        ]


def _layer_of(param: str) -> str:
    """The layer (module) owning a parameter named ``module.path.name``."""
    module, _, _ = param.rpartition(".")
    return module or "(root)"


class Activations(Rule):
    """Dead ReLUs (outputs exactly zero; or a layer's inputs exactly zero, wherever the
    ReLU was written) or saturated tanh/sigmoid, on sampled steps in a row. One alert per
    kind, naming the first module."""

    kind: str = AlertKind.DEAD_ACTIVATIONS
    kinds = (AlertKind.DEAD_ACTIVATIONS, AlertKind.SATURATED_ACTIVATIONS)

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._samples: dict[int, int] = {}
        self._since: dict[int, int] = {}

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.activations is None:
            return None
        info = history.info
        hits: dict[str, dict[int, float]] = {
            AlertKind.DEAD_ACTIVATIONS: {},
            AlertKind.SATURATED_ACTIVATIONS: {},
        }
        for i, fraction in enumerate(view.activations):
            if fraction is None or i >= len(info.activations):
                continue
            family = info.activations[i][1]
            dead = family in ("relu", "input")
            limit = self.t.dead_fraction if dead else self.t.saturated_fraction
            if fraction < limit:
                self._samples.pop(i, None)
                self._since.pop(i, None)
                continue
            self._samples[i] = self._samples.get(i, 0) + 1
            since = self._since.setdefault(i, view.step)  # a sampled step shows only itself
            if (
                self._samples[i] >= self.t.activation_samples
                and view.step - since >= self.t.activation_steps
            ):
                which = AlertKind.DEAD_ACTIVATIONS if dead else AlertKind.SATURATED_ACTIVATIONS
                hits[which][i] = fraction
        findings = []
        for kind, found in hits.items():
            if not found:
                continue
            order = first_failing({i: self._since[i] for i in found})
            first = order[0]
            names = [info.activations[i][0] for i in order]
            family = info.activations[first][1]
            measure = {"relu": "zero_fraction", "input": "input_zero_fraction"}.get(
                family, "saturated_fraction"
            )
            layers = list(dict.fromkeys(name for i in order for name in _layers_of(info, i)))
            step = self._since[first] + self.t.activation_steps
            # The count and range are of the layers listed, not of the activations
            # found (two ReLUs fed by one layer are that one layer's)
            findings.append(
                self.alert(
                    step,
                    names[0],
                    {
                        measure: found[first],
                        "samples": self._samples[first],
                        **spread(ordered_range(layers, info.layers)),
                    },
                    kind=kind,
                    layers=layers,
                )
            )
        return findings


def _layers_of(info: RunInfo, index: int) -> list[str]:
    """The layers an activation entry concerns: the one feeding it, and for a layer's
    input the layer itself."""
    name, family = info.activations[index]
    layers = []
    feeding = info.feeding_layer(index)
    if feeding is not None:
        layers.append(feeding)
    if family == "input":
        layers.append(name.removesuffix(INPUT_SUFFIX))
    return layers
