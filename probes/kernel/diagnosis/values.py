"""Rung 2, shapes and values: every number of a record must be finite.

(The loss contract and shapes are checked before training by ``probes.check_batch``;
its findings arrive as alerts from the training side.)
"""

from __future__ import annotations

import math

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast, RunInfo, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class NonFinite(Rule):
    """Any numeric field of a record is NaN or Inf: the seed's finite check, every field."""

    kind: str = AlertKind.NON_FINITE
    severity: Severity = Severity.ERROR

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._first: Alert | None = None
        self._step_found: tuple[str, float] | None = None
        self._eval_found: tuple[str, float] | None = None

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        self._step_found = _first_non_finite_step_field(view, history.info)
        # A record standing for several steps says at which one the first appeared.
        step = view.first_non_finite_step if view.first_non_finite_step is not None else (view.step)
        return self._hold(step, self._step_found or self._eval_found)

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        bad = next((k for k, v in view.scalars.items() if not math.isfinite(v)), None)
        # an eval's verdict holds until the next eval, a step's until the next step
        self._eval_found = None if bad is None else (f"eval.{bad}", view.scalars[bad])
        return self._hold(view.step, self._step_found or self._eval_found)

    def _hold(self, step: int, found: tuple[str, float] | None) -> Findings:
        if found is None:
            self._first = None
            return []
        if self._first is None:  # keep the first field and step as the evidence
            field_name, value = found
            self._first = self.alert(step, field_name, {"value": value, "first_step": step})
        return [self._first]


def _first_non_finite_step_field(view: StepView, info: RunInfo) -> tuple[str, float] | None:
    if _all_finite(view):  # nearly every record: one sum instead of a walk
        return None
    for name, value in view.scalars.items():
        if not math.isfinite(value):
            return name, value
    # Non-finite gradients that never reached optimizer.step() left the weights alone:
    # AMP's GradScaler skips such steps by design (skipped_updates judges a streak).
    grads_applied = view.optimizer_stepped
    if grads_applied and view.non_finite_grads:
        bad = next(
            (i for i, g in enumerate(view.grad_norms) if g is not None and not math.isfinite(g)),
            None,
        )
        if bad is not None:
            return f"grad_norm[{info.layer(bad)}]", view.grad_norms[bad]  # type: ignore[return-value]
        return "grad_norm_total", view.grad_norm_total  # type: ignore[return-value]
    for label, values in (
        ("grad_norm", view.grad_norms if grads_applied else None),
        ("param_norm", view.param_norms),
        ("update_ratio", view.update_ratios),
    ):
        for i, number in enumerate(values or ()):
            if number is not None and not math.isfinite(number):
                return f"{label}[{info.layer(i)}]", number
    for i, number in enumerate(view.activations or ()):
        if number is not None and not math.isfinite(number):
            name = info.activations[i][0] if i < len(info.activations) else f"activation {i}"
            return f"activation[{name}]", number
    return None


def _all_finite(view: StepView) -> bool:
    """True when every number the rule reads is finite: a NaN or an Inf makes the sum
    of them non-finite (as does an overflowing sum, which the walk then clears)."""
    total = sum(view.scalars.values())
    for values in (view.grad_norms, view.param_norms, view.update_ratios, view.activations):
        if values:
            total += sum(filter(None, values))  # (None and 0.0 drop out: both finite)
    return math.isfinite(total) and (
        view.grad_norm_total is None or math.isfinite(view.grad_norm_total)
    )
