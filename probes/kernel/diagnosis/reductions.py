"""Rung 6, evaluation: training and validation losses computed like for like. A
training loss that is a steady whole multiple of the validation loss, evaluation after
evaluation, with the evidence of where the multiple comes from (the accumulation steps
seen in the records, or a ratio that held while the losses moved: a sum against a mean),
is a reduction that differs, not a model that fits one set better. A steady ratio
without that evidence is not one: label smoothing in training against plain
cross-entropy in validation adds a floor to the training loss (about 0.5 nats with ten
classes and 0.1), a steady multiple of a confident model's validation loss that holds
only while the losses stand still."""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Any

from probes.kernel.diagnosis.rule import Findings, Rule, reached_at
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


def _spread(values: list[float]) -> float:
    """Max over min, less 1, of positive values."""
    return max(values) / min(values) - 1


class LossReductionMismatch(Rule):
    """The smoothed training loss at least ``reduction_factor`` times the validation
    loss on ``reduction_evals`` evaluations in a row, their ratios within
    ``reduction_steadiness`` of each other, near a whole number N >= 2 with the evidence
    for it: the latest update's gradients took N backward passes (an accumulated loss
    not divided; the ratio within ``reduction_steadiness`` of N, the healthy gap), or,
    the ratio within its own spread (at least ``reduction_whole``) of N, it held while
    the losses moved (its spread at most ``reduction_held`` of the validation
    loss's and of the train - val difference's: a sum scales with the loss, a floor
    added to it does not). Once found, the alert holds while the ratio stays steady
    within ``reduction_steadiness`` of N. Overfitting (validation above training, the
    gap growing) and the usual dropout gap (training a little above) are not it.

    With no validation to compare against, the training side's own evidence says it:
    ``undivided_passes`` k >= 2 on ``reduction_undivided_updates`` updates in a row
    (each update's gradient the sum of k mean losses' gradients, undivided, from one
    loop: ``probes.runtime.measure.undivided``), and it holds while they continue."""

    kind: str = AlertKind.LOSS_REDUCTION_MISMATCH

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._pairs: deque[tuple[float, float]] = deque(maxlen=thresholds.reduction_evals)
        self._passes: int | None = None  # backward passes into the latest update's gradients
        self._found: tuple[int, dict[str, Any]] | None = None  # (N, its evidence)
        self._undivided_since: int | None = None  # the first update of the current streak
        self._undivided = 0  # its k

    def _undivided_finding(self, view: StepView) -> Findings:
        """The training side's evidence (see the class): None while it says nothing."""
        k = view.undivided_passes
        if not view.optimizer_stepped:
            return None if self._undivided_since is None else []
        if k < 2 or (self._undivided and k != self._undivided):
            self._undivided_since = None
            self._undivided = 0
            return None
        if self._undivided_since is None:
            self._undivided_since, self._undivided = view.first, k
        at = reached_at(self._undivided_since, self.t.reduction_undivided_updates, view)
        if at is None:
            return None
        evidence = {
            "nearest_whole": k,
            "backward_passes": k,
            "each_on": "a mean loss as returned (not divided by the passes)",
            "since_step": self._undivided_since,
        }
        return [self.alert(at, "loss", evidence)]

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        counts = view.more_layers.get("backward_passes")
        if counts:
            seen = Counter(int(c) for c in counts if c is not None and c >= 1)
            if seen:  # most layers' count (ties: the larger)
                self._passes = max(seen, key=lambda c: (seen[c], c))
        return self._undivided_finding(view)

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        if self._undivided_since is not None:
            return None  # the training side's evidence holds: it speaks for the rule
        val = view.loss
        train = history.smoothed_loss(view.step, self.t.smoothing_steps)
        if val is None or train is None or not math.isfinite(val) or not math.isfinite(train):
            return None
        # A ratio of losses is a multiple only above zero (a floor there): not otherwise.
        if not (val > 0 and train > 0) or train < self.t.reduction_factor * val:
            self._pairs.clear()
            self._found = None
            return []
        self._pairs.append((train, val))
        if len(self._pairs) < self.t.reduction_evals:
            return []
        ratios = [t / v for t, v in self._pairs]
        spread = _spread(ratios)
        steady = sorted(ratios)[len(ratios) // 2]
        if spread > self.t.reduction_steadiness:
            self._found = None
            return []
        if self._found is not None and (
            abs(steady / self._found[0] - 1) > self.t.reduction_steadiness
        ):
            self._found = None
        if self._found is None:
            self._found = self._evidence(steady, spread)
            if self._found is None:
                return []
        whole, evidence = self._found
        return [
            self.alert(
                view.step,
                "loss",
                {
                    "train_over_val": steady,
                    "nearest_whole": whole,
                    **evidence,
                    "train_loss": train,
                    "val_loss": val,
                    "evals": len(ratios),
                },
            )
        ]

    def _evidence(self, steady: float, spread: float) -> tuple[int, dict[str, Any]] | None:
        """The whole number the steady ratio stands for and the records' evidence for it,
        or None: no whole number (within the ratios' own spread), or no evidence."""
        passes = self._passes
        if (
            passes is not None
            and passes >= 2
            and (abs(steady / passes - 1) <= self.t.reduction_steadiness)
        ):  # the records saw the accumulation: the whole number is theirs
            return passes, {"backward_passes": passes, "cause": "accumulation not divided"}
        whole = round(steady)
        if whole < 2 or abs(steady / whole - 1) > max(spread, self.t.reduction_whole):
            return None
        vals = [v for _, v in self._pairs]
        moved = min(_spread(vals), _spread([t - v for t, v in self._pairs]))
        if spread <= self.t.reduction_held * moved:  # the ratio held while they moved
            return whole, {"summed_over": whole, "val_moved": _spread(vals)}
        return None
