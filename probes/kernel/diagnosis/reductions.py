"""Rung 6, evaluation: training and validation losses computed like for like. A
training loss that is a steady multiple of the validation loss, evaluation after
evaluation, is a reduction that differs (a sum against a mean, a loss not divided by
the gradient accumulation steps), not a model that fits one set better."""

from __future__ import annotations

import math
from collections import deque

from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast
from probes.kernel.diagnosis.vocabulary import AlertKind


class LossReductionMismatch(Rule):
    """The smoothed training loss at least ``reduction_factor`` times the validation
    loss on ``reduction_evals`` evaluations in a row, their ratios within
    ``reduction_steadiness`` of each other. Overfitting (validation above training,
    the gap growing) and the usual dropout gap (training a little above) are not it."""

    kind: str = AlertKind.LOSS_REDUCTION_MISMATCH

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._ratios: deque[float] = deque(maxlen=thresholds.reduction_evals)

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        val = view.loss
        train = history.smoothed_loss(view.step, self.t.smoothing_steps)
        if val is None or train is None or not math.isfinite(val) or not math.isfinite(train):
            return None
        if not (val > 0 and train > 0):
            self._ratios.clear()
            return []
        ratio = train / val
        if ratio < self.t.reduction_factor:
            self._ratios.clear()
            return []
        self._ratios.append(ratio)
        ratios = self._ratios
        if len(ratios) < self.t.reduction_evals or max(ratios) > (
            1 + self.t.reduction_steadiness
        ) * min(ratios):
            return []
        steady = sorted(ratios)[len(ratios) // 2]
        return [
            self.alert(
                view.step,
                "loss",
                {
                    "train_over_val": steady,
                    "nearest_whole": round(steady),
                    "train_loss": train,
                    "val_loss": val,
                    "evals": len(ratios),
                },
            )
        ]
