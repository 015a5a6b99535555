"""Rung three of the checklist: the tiny-batch test.

``overfit_batch`` trains a copy of the model on a few examples with its stochastic
regularisers off and says whether it can drive the loss down: failure points toward
wiring or optimisation; success does not prove generalisation. The model itself is not
touched: weights, mode and gradients are as they were.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probes.checks.batch_checks import LossFn, forward, split_batch
from probes.checks.reports import CheckReport, Finding
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity
from probes.kernel.schema.spec import EventName

if TYPE_CHECKING:
    from probes.runtime.probe import Probe


STOCHASTIC_REGULARISERS = (nn.modules.dropout._DropoutNd,)


def overfit_batch(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    steps: int = 300,
    target: float | None = None,
    *,
    probe: Probe | None = None,
) -> CheckReport:
    """Can a copy of the model drive the loss down on a few examples?

    The copy has dropout (and the like) switched off; the original model's weights,
    mode and gradients are untouched.

    Args:
        model: the model.
        batch: ``(inputs, targets)``, a few examples.
        loss_fn: the training loss.
        optimizer: a function from parameters to an optimizer (default: Adam, lr 1e-2:
            a few examples should be fitted fast).
        steps: training steps on the batch.
        target: success when the loss ends at or below this; by default when it falls
            to 5% of its first value.
        probe: stream the curve and send the report to the monitor through this probe.

    Returns:
        A ``CheckReport`` with the loss curve in its summary; findings
        ``cannot_overfit`` (error) or ``non_finite_loss``.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    inputs, targets = split_batch(batch)
    twin = copy.deepcopy(model)
    twin.train()
    for module in twin.modules():
        if isinstance(module, STOCHASTIC_REGULARISERS):
            module.eval()  # stochastic regularisers off: only fitting is tested
    make = optimizer or (lambda params: torch.optim.Adam(params, lr=1e-2))
    opt = make(twin.parameters())
    curve: list[float] = []
    started = time.perf_counter()
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(twin, inputs), targets)
        curve.append(float(loss))
        if not math.isfinite(curve[-1]):
            break
        loss.backward()
        opt.step()
        if probe is not None and (step % max(steps // 50, 1) == 0):
            probe.event(EventName.OVERFIT_BATCH, loss=curve[-1], at=step)
    return _overfit_report(curve, target, steps, time.perf_counter() - started).send(probe)


def _overfit_report(
    curve: list[float], target: float | None, steps: int, seconds: float
) -> CheckReport:
    first, last = curve[0], curve[-1]
    goal = target if target is not None else 0.05 * first
    report = CheckReport(
        "overfit_batch",
        summary={
            "first_loss": first,
            "last_loss": last,
            "goal": goal,
            "steps": len(curve),
            "seconds": round(seconds, 3),
            "curve": [curve[i] for i in range(0, len(curve), max(len(curve) // 20, 1))],
        },
        signal="Success does not prove the model will generalise; failure points at wiring "
        "(a detached layer, a wrong loss) or optimisation (learning rate, init).",
    )
    if not math.isfinite(last):
        report.findings.append(
            Finding(
                AlertKind.NON_FINITE_LOSS,
                Severity.ERROR,
                "loss",
                f"the loss became non-finite after {len(curve)} steps on a tiny batch",
                "Lower the learning rate alone; if it persists, run one step under anomaly "
                "detection.",
                {"steps": len(curve)},
            )
        )
    elif last > goal:
        report.findings.append(
            Finding(
                AlertKind.CANNOT_OVERFIT,
                Severity.ERROR,
                "loss",
                f"after {steps} steps on a tiny batch the loss went from {first:.4g} to "
                f"{last:.4g}, not down to {goal:.4g}",
                "Check that gradients reach every layer (no .detach(), no frozen parts), then "
                "the loss contract (check_batch), then the learning rate alone.",
                {"first_loss": first, "last_loss": last, "goal": goal},
            )
        )
    return report
