"""Rung 3, the tiny-batch test: can the model drive the loss down at all?

(``probes.overfit_batch`` runs the test itself before training; its finding arrives as
an alert from the training side. During training, a loss that stays where it started
is the same signal.)
"""

from __future__ import annotations

import math

from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView, weighted_mean
from probes.kernel.diagnosis.vocabulary import AlertKind


class FlatLoss(Rule):
    """Training loss not decreasing: after a while, still where it started."""

    kind: str = AlertKind.FLAT_LOSS
    START_STEPS = 10  # the loss "where it started": the records of the first steps

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._flat = False
        self._began: tuple[int, int, float | None] | None = None  # (records, last step, loss)

    def _start_losses(self, view: StepView) -> list[tuple[float, int]]:
        """(loss, steps) of a record among the first: its steps' own before
        ``START_STEPS`` where it carries them (as unthinned records would give), else
        its estimate, counted for the steps it stands for (up to ``START_STEPS``)."""
        pairs = view.losses_by_step
        if pairs is not None and view.steps > 1:
            return [
                (loss, 1) for step, loss in pairs if step < self.START_STEPS and math.isfinite(loss)
            ]
        estimate = view.loss_estimate
        return [] if estimate is None else [(estimate, min(view.steps, self.START_STEPS))]

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if history.adversarial:
            return []  # a game's losses (a GAN's players) are not meant to fall
        if view.step < self.t.flat_after_steps:
            return None
        # Counted in steps: a thinned run's first records stand for more steps each.
        first = history.first_steps
        if self._began is None or self._began[0] != len(first):  # (fixed once they are in)
            early = [s for s in first if s.first < self.START_STEPS] or first[:1]
            self._began = (
                len(first),
                early[-1].step if early else -1,
                weighted_mean([pair for s in early for pair in self._start_losses(s)]),
            )
        _, early_end, began = self._began
        if began is None:
            return None
        recent = history.recent_losses(view.step, self.t.smoothing_steps, after_step=early_end)
        now = weighted_mean(recent)
        if now is None or began <= 0:
            return []
        # Hysteresis on the value itself: once flat, the loss must fall half as far
        # again before the alert clears, so noise at the line does not flap it.
        drop = self.t.flat_min_drop * (1.5 if self._flat else 1.0)
        self._flat = now >= began * (1 - drop)
        if not self._flat:
            return []
        # a record standing for several steps: judged at the first of them past the mark
        step = max(view.first, self.t.flat_after_steps)
        return [self.alert(step, "", {"loss_at_start": began, "loss_now": now, "steps": step})]
