"""Rung 6, evaluation: validation in eval mode and without gradients, and the train and
validation curves against each other."""

from __future__ import annotations

import math

from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity


class EvalMode(Rule):
    """Validation run in training mode, or with gradient recording on: two alerts,
    because ``model.eval()`` and ``torch.inference_mode()`` are orthogonal controls."""

    kind: str = AlertKind.EVAL_IN_TRAIN_MODE
    kinds = (AlertKind.EVAL_IN_TRAIN_MODE, AlertKind.EVAL_WITH_GRAD)

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        findings = []
        if view.train_mode_forwards:
            sensitive = history.info.mode_sensitive
            findings.append(
                self.alert(
                    view.step,
                    "",
                    {
                        "forwards_in_train_mode": view.train_mode_forwards,
                        "forwards": view.forwards,
                        "dropout_or_batchnorm_modules": sensitive,
                    },
                    severity=Severity.ERROR if sensitive else Severity.WARNING,
                )
            )
        if view.grad_forwards:
            findings.append(
                self.alert(
                    view.step,
                    "",
                    {"forwards_with_grad": view.grad_forwards, "forwards": view.forwards},
                    kind=AlertKind.EVAL_WITH_GRAD,
                )
            )
        return findings


class OverfittingSignal(Rule):
    """Training loss falling while validation loss rises, over smoothed windows."""

    kind: str = AlertKind.OVERFITTING_SIGNAL

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._train_at: dict[int, float | None] = {}  # smoothed train loss at each eval

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        self._train_at.setdefault(
            view.step, history.smoothed_loss(view.step, self.t.smoothing_steps)
        )
        if len(self._train_at) > 2 * (history.evals.maxlen or 256):  # keep what evals keep
            kept = {e.step for e in history.evals}
            self._train_at = {k: v for k, v in self._train_at.items() if k in kept}
        evals = [e for e in history.evals if e.loss is not None and math.isfinite(e.loss)]
        if len(evals) < self.t.overfit_min_evals:
            return []
        best = min(evals, key=lambda e: e.loss)  # type: ignore[arg-type, return-value]
        latest = evals[-1]
        assert best.loss is not None and latest.loss is not None
        if latest is best or not self._validation_rose(evals, best):
            return []
        train_then = self._train_at.get(best.step)
        train_now = self._train_at.get(latest.step)
        if train_then is None or train_now is None:
            return []
        if train_now > train_then * (1 - self.t.overfit_train_drop):
            return []
        return [
            self.alert(
                latest.step,
                "",
                {
                    "val_loss": latest.loss,
                    "best_val_loss": best.loss,
                    "best_at_step": best.step,
                    "train_loss_then": train_then,
                    "train_loss_now": train_now,
                },
            )
        ]

    def _validation_rose(self, evals: list[EvalView], best: EvalView) -> bool:
        """The latest evals rose above the best: by ``overfit_val_rise`` on the last
        ``overfit_rising_evals`` evals in a row, or by ``overfit_val_jump`` at once. One
        noisy eval (a small validation set) is not a rise."""
        assert best.loss is not None
        after = evals[evals.index(best) + 1 :]
        latest = after[-1].loss
        assert latest is not None
        if latest > best.loss * (1 + self.t.overfit_val_jump):
            return True
        last = after[-self.t.overfit_rising_evals :]
        return len(last) == self.t.overfit_rising_evals and all(
            e.loss is not None and e.loss > best.loss * (1 + self.t.overfit_val_rise) for e in last
        )
