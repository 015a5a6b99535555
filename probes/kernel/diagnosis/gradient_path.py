"""Rung 4, the gradient path: norms by layer, missing gradients, dead or saturated
activations. Each rule raises one alert for however many layers, naming the first
failing one (the first to fail, then the first in the model) and listing the others."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
from probes.kernel.diagnosis.update_ratio import converged
from probes.kernel.diagnosis.views import RecentPast, RunInfo, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.schema import INPUT_SUFFIX


class VanishingGradient(Rule):
    """Layers whose gradients stay tiny next to the largest layer's or to their own
    weights, for many steps in a row (the largest value of a record's span counts)."""

    kind: str = AlertKind.VANISHING_GRADIENT
    replicated = True  # it reads what every replica holds alike

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streaks = Streaks()
        self._last_params: Sequence[float | None] | None = None

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.param_norms is not None:
            self._last_params = view.param_norms
        if converged(history, view, self.t):
            # A finished fit (its loss a hundred-thousandth of where it began): its
            # gradients vanish by design, not because they cannot reach a layer.
            self._streaks = Streaks()
            return []
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
    replicated = True  # it reads what every replica holds alike

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
    replicated = True  # it reads what every replica holds alike
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
