"""Rung 6, evaluation: validation in eval mode and without gradients, and the train and
validation curves against each other."""

from __future__ import annotations

import math

from probes.kernel.diagnosis.alert import Alert
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity


class EvalMode(Rule):
    """Validation run in training mode, or with gradient recording on: two alerts,
    because ``model.eval()`` and ``torch.inference_mode()`` are orthogonal controls.

    Training mode is raised only where it changes the numbers: a module that behaves
    differently in it ran so (the probe counts them: ``sensitive_train_forwards``), or
    dropout was called as a function with ``training=True`` (``F.dropout(x, p)``
    survives ``model.eval()``). A record from an older probe, without those counts,
    is judged as before: an error with mode-sensitive modules, a warning without."""

    kind: str = AlertKind.EVAL_IN_TRAIN_MODE
    kinds = (AlertKind.EVAL_IN_TRAIN_MODE, AlertKind.EVAL_WITH_GRAD)

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        findings = []
        training_mode = self._training_mode(history, view)
        if training_mode is not None:
            findings.append(training_mode)
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

    def _training_mode(self, history: RecentPast, view: EvalView) -> Alert | None:
        sensitive = history.info.mode_sensitive
        if view.sensitive_train_forwards is None:  # an older probe's record
            if not view.train_mode_forwards:
                return None
            evidence: dict[str, object] = {
                "forwards_in_train_mode": view.train_mode_forwards,
                "forwards": view.forwards,
                "dropout_or_batchnorm_modules": sensitive,
            }
            return self.alert(
                view.step,
                "",
                evidence,
                severity=Severity.ERROR if sensitive else Severity.WARNING,
            )
        functional = view.dropout_train_calls or 0
        if not view.sensitive_train_forwards and not functional:
            return None  # eval() would change nothing that ran
        evidence = {
            "forwards_in_train_mode": view.train_mode_forwards,
            "forwards": view.forwards,
            "dropout_or_batchnorm_modules": sensitive,
            "sensitive_forwards_in_train_mode": view.sensitive_train_forwards,
        }
        if functional and not view.sensitive_train_forwards:
            # every dropout call then came from a function, not a module in train mode
            evidence["functional_dropout_calls"] = functional
            evidence["fix"] = "F.dropout(x, p, training=self.training)"
        return self.alert(view.step, "", evidence, severity=Severity.ERROR)


class OverfittingSignal(Rule):
    """Training loss falling while validation loss rises, over smoothed windows.

    The validation loss is each eval record's (``EvalView.loss``: ``val_loss`` first,
    ``probes.kernel.schema.validation_loss_name``). An evaluation found with no step API
    that computed several splits (a GCN's train, val and test masks) names the one for
    validation ``val_loss``, else its first (``probes.runtime.evaluation.autoeval``): the others
    (``test_loss``, ``val_loss[1]``) are not read here, and never averaged into it.

    Each change is read against the loss's own scale (``RecentPast.loss_scale``): the
    loss itself while it stays above zero (the fractions of ``overfit_*``, as ratios),
    the distance the run travelled once it reached zero or below (a density's NLL: a
    fraction of a negative loss flips sign, and a rise of 0.03 nats at -2.4 was read as
    one of 10%)."""

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
        if latest is best or not self._validation_rose(history, evals, best):
            return []
        train_then = self._train_at.get(best.step)
        train_now = self._train_at.get(latest.step)
        if train_then is None or train_now is None:
            return []
        fell = train_then - train_now
        if fell < self.t.overfit_train_drop * history.loss_scale(train_then, train_now):
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

    def _validation_rose(self, history: RecentPast, evals: list[EvalView], best: EvalView) -> bool:
        """The latest evals rose above the best: by ``overfit_val_rise`` of its scale on
        the last ``overfit_rising_evals`` evals in a row, or by ``overfit_val_jump`` at
        once. One noisy eval (a small validation set) is not a rise."""
        lowest = best.loss
        assert lowest is not None
        after = evals[evals.index(best) + 1 :]
        latest = after[-1].loss
        assert latest is not None
        scale = history.loss_scale(lowest, latest)
        if latest - lowest > self.t.overfit_val_jump * scale:
            return True
        last = after[-self.t.overfit_rising_evals :]
        return len(last) == self.t.overfit_rising_evals and all(
            e.loss is not None and e.loss - lowest > self.t.overfit_val_rise * scale for e in last
        )
