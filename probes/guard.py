"""The guard's alert: non-finite gradients reached ``optimizer.step()`` and were kept
from the weights (see ``probes.step.GuardTrip``)."""

from __future__ import annotations

from probes.diagnosis import Alert
from probes.step import GuardTrip


def guard_alert(trip: GuardTrip) -> Alert:
    """The alert the guard raises when it skips an update."""
    layers = ", ".join(trip.layers[:6])
    return Alert(
        "guard_skipped_update", "error", trip.step, trip.layers[0] if trip.layers else "",
        {"non_finite_layers": len(trip.layers), "layers": layers,
         "first_value": trip.norms[0] if trip.norms else float("nan")},
        "Non-finite gradients reached optimizer.step(): the guard skipped this update, as "
        "GradScaler does, so the weights stay finite, and paused the run. It hides the "
        "symptom once; it does not remove the cause.",
        ("Run the next step under anomaly detection (press a) to find the op and layer.",
         "Lower the learning rate alone (x0.5) and resume.",
         "Inspect this step's batch for extreme or non-finite inputs."),
    )
