"""Rung 5, the update: a loss that jumps and stays high (the optimisation diverged),
judged against the run's own first loss, within a few steps of the jump."""

from __future__ import annotations

import math

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import Findings, Rule, reached_at
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class LossDiverged(Rule):
    """The loss at least ``diverged_factor`` times the run's first loss (the first
    record's least: before the updates it judges) on every step of ``diverged_steps``
    in a row. A record standing for several steps counts by its least loss: it stayed
    high only if its lowest step did. A spike that returns is ``loss_spike``'s; a loss
    that goes negative has no scale to diverge from; nor do a game's (a GAN's
    generator's loss rises as its discriminator learns: ``RecentPast.adversarial``)."""

    kind: str = AlertKind.LOSS_DIVERGED
    severity: Severity = Severity.ERROR

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._start: float | None = None  # the run's first finite loss (its least)
        self._since: int | None = None  # the first step of the current run of high losses

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if history.adversarial:
            self._since = None
            return []  # a game's losses: not a scale to diverge from
        low = view.loss_min
        if low is None or not math.isfinite(low):
            return None  # no finite loss: nothing new to say (non_finite's business)
        if self._start is None:
            self._start = low
            return []
        start = self._start
        if not start > 0 or low < self.t.diverged_factor * start:
            self._since = None
            return []
        if self._since is None:
            self._since = view.first
        step = reached_at(self._since, self.t.diverged_steps, view)
        if step is None:
            return []
        return [
            self.alert(
                step,
                "loss",
                {
                    "loss": view.loss if view.loss is not None else low,
                    "first_loss": start,
                    "times": low / start,
                    "since_step": self._since,
                },
            )
        ]
