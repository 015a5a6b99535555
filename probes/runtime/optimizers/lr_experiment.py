"""The monitor's learning-rate experiment (``-`` / ``+``), watched until the LR moves.

A loop that sets the learning rate each step (a scheduler recomputing it from its base)
undoes the experiment at once; the probe then says so, once, since the chart's marker
would claim a change that did not last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from probes.kernel.diagnosis import Alert
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity


@dataclass(frozen=True)
class LrExperiment:
    """The monitor's learning-rate change, watched until the LR next moves."""

    step: int  # the first step run with it
    factor: float
    before: list[float]
    set_to: list[float]

    WATCH_STEPS: ClassVar[int] = 1000  # unchanged this long: it held

    def undone_by(self, now: list[float]) -> bool:
        """True if the learning rates went back near their values before the change
        (a scheduler recomputing them from its base), not on with it (StepLR's decay)."""
        return len(now) == len(self.before) and all(
            math.isclose(n, b, rel_tol=0.25) for n, b in zip(now, self.before, strict=True)
        )

    def alert(self, step: int, now: list[float]) -> Alert:
        return Alert(
            AlertKind.LR_EXPERIMENT_UNDONE,
            Severity.INFO,
            step,
            "",
            {
                "factor": self.factor,
                "lr_before": self.before[0],
                "lr_set": self.set_to[0],
                "lr_now": now[0],
                "lasted_steps": step - self.step,
            },
            "The learning rate went back to about where it was before the change: the loop "
            "may set it each step (a scheduler recomputing it), so the experiment may not "
            "have lasted; a decay that happens to land there looks the same. The marker on "
            "the chart shows when it began, not that it held.",
            (
                "Change the scheduler's base learning rate (max_lr, base_lrs) and restart.",
                "Or step the scheduler less often while experimenting; nothing else changes.",
                "Compare a few hundred steps before and after, on the same data order.",
            ),
        )


def scale_learning_rates(
    optimizer: torch.optim.Optimizer, factor: float, first_step: int
) -> tuple[list[float], LrExperiment | None]:
    """Multiply every param group's learning rate by ``factor``; the new rates, and the
    experiment to watch from ``first_step``. None with tensor rates: they are read here
    once (the answer shows them), but watching means reading them at every step, a
    device sync a step for a rate on the device."""
    before, new = [], []
    for group in optimizer.param_groups:
        before.append(float(group["lr"]))
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].mul_(factor)
        else:
            group["lr"] = group["lr"] * factor
        new.append(float(group["lr"]))
    plain = not any(isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups)
    return new, LrExperiment(first_step, factor, before, new) if plain else None


def check_experiment(
    experiment: LrExperiment, optimizer: torch.optim.Optimizer, step: int
) -> tuple[LrExperiment | None, Alert | None]:
    """Did the loop (a scheduler) set the learning rate back since the experiment? The
    experiment still to watch (None once it held, or moved), and the alert to send when
    it was undone."""
    now = [group["lr"] for group in optimizer.param_groups]
    if now == experiment.set_to:
        held = step - experiment.step >= LrExperiment.WATCH_STEPS
        return (None if held else experiment), None
    return None, experiment.alert(step, now) if experiment.undone_by(now) else None
