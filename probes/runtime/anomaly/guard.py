"""The guard, in one place: non-finite gradients found before ``optimizer.step()`` are
kept from the weights, the alert says where, and the run pauses (the step boundary in
``probes.runtime.steps.step`` raises the alert and pauses).

The check costs one host/device synchronisation a step (the finiteness must be read),
which is why the guard is off by default. Skipping is done by dropping the gradients:
the optimizers of torch.optim leave a parameter without a gradient untouched (state,
weight decay and all), as GradScaler's skip does, so nothing is raised into a loop the
probe does not own (a framework's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from probes.kernel.diagnosis import Alert
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity
from probes.runtime.measure.layers import LayerMap
from probes.runtime.measure.stats import Measurement, compose_order


@dataclass(frozen=True)
class GuardTrip:
    """Non-finite gradients before ``optimizer.step()``: which layers (model order) and
    their first norms."""

    step: int
    layers: list[str]
    norms: list[float]


def find_non_finite(step: Measurement, layers: LayerMap) -> GuardTrip | None:
    """One host sync: are all of the step's gradient norms (read already) finite? If not,
    which layers hold the non-finite ones."""
    if not step.grad_norms:
        return None
    norms = torch.stack(step.grad_norms)
    if bool(torch.isfinite(norms).all()):
        return None
    values = norms.tolist()
    order = compose_order(step.grad_present, step.grad_order)
    indices = order if order is not None else range(len(values))
    bad_layers: dict[str, float] = {}
    for value, param_index in zip(values, indices, strict=True):
        if not math.isfinite(value):
            bad_layers.setdefault(layers.names[layers.param_layer[param_index]], value)
    ordered = [name for name in layers.names if name in bad_layers]
    return GuardTrip(step.step, ordered, [bad_layers[name] for name in ordered])


def skip_update(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None) -> None:
    """Make the coming ``optimizer.step()`` change nothing: drop every gradient (the
    watched parameters', and those of the optimizer's groups)."""
    for param in params:
        param.grad = None
    if optimizer is not None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None


def guard_alert(trip: GuardTrip) -> Alert:
    """The alert the guard raises when it skips an update."""
    layers = ", ".join(trip.layers[:6])
    return Alert(
        AlertKind.GUARD_SKIPPED_UPDATE,
        Severity.ERROR,
        trip.step,
        trip.layers[0] if trip.layers else "",
        {
            "non_finite_layers": len(trip.layers),
            "layers": layers,
            "first_value": trip.norms[0] if trip.norms else float("nan"),
        },
        "Non-finite gradients reached optimizer.step(): the guard skipped this update, as "
        "GradScaler does, so the weights stay finite, and paused the run. It hides the "
        "symptom once; it does not remove the cause.",
        (
            "Run the next step under anomaly detection (press a) to find the op and layer.",
            "Lower the learning rate alone (x0.5) and resume.",
            "Inspect this step's batch for extreme or non-finite inputs.",
        ),
    )
