"""Rung 2, shapes and values: every number of a record must be finite.

(The loss contract and shapes are checked before training by ``probes.check_batch``;
its findings arrive as alerts from the training side.)
"""

from __future__ import annotations

import math
from typing import Any

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast, RunInfo, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.kernel.schema.floats import Float32List


class NonFinite(Rule):
    """Any numeric field of a record is NaN or Inf: the seed's finite check, every field."""

    kind: str = AlertKind.NON_FINITE
    severity: Severity = Severity.ERROR

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._first: Alert | None = None
        self._step_found: Found | None = None
        self._eval_found: Found | None = None
        self._first_output: dict[str, Any] = {}  # a sampled step's first module out of range

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        self._step_found = _first_non_finite_step_field(view, history.info)
        self._first_output = _first_non_finite_output(view, history.info)
        # A record standing for several steps says at which one the first appeared.
        step = view.first_non_finite_step if view.first_non_finite_step is not None else (view.step)
        return self._hold(step, self._step_found or self._eval_found)

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        bad = next((k for k, v in view.scalars.items() if not math.isfinite(v)), None)
        # an eval's verdict holds until the next eval, a step's until the next step
        self._eval_found = None if bad is None else (f"eval.{bad}", view.scalars[bad])
        return self._hold(view.step, self._step_found or self._eval_found)

    def _hold(self, step: int, found: Found | None) -> Findings:
        if found is None:
            self._first = None
            return []
        if self._first is None:  # keep the first field and step as the evidence
            field_name, value, *order = found
            evidence: dict[str, Any] = {"value": value, "first_step": step}
            if order:
                evidence["order"] = order[0]
            evidence.update(self._first_output)
            fed_by = self._first_output.get("fed_by")
            if fed_by is not None and "[" not in field_name:  # a scalar (the loss) went
                # bad downstream of the first failing layer, seen forward: the subject
                evidence["field"] = field_name
                field_name = fed_by
            self._first = self.alert(step, field_name, evidence)
        return [self._first]


#: The first non-finite field, its value, and (for gradients) the order it is first in.
Found = tuple[str, float] | tuple[str, float, str]

#: What a gradient's first failing layer is first in: the backward pass's order.
BACKWARD_ORDER = "backward"


def _first_non_finite_step_field(view: StepView, info: RunInfo) -> Found | None:
    if _all_finite(view):  # nearly every record: one sum instead of a walk
        return None
    for name, value in view.scalars.items():
        if not math.isfinite(value):
            return name, value
    # Non-finite gradients that never reached optimizer.step() left the weights alone:
    # AMP's GradScaler skips such steps by design (skipped_updates judges a streak).
    grads_applied = view.optimizer_stepped
    if grads_applied and view.non_finite_grads:
        # The loss is finite (checked above): the NaN was born in backward, and flows
        # from where it was born towards the input. The first failing layer is then the
        # first in backward order, the one nearest its producer: the reverse of the
        # model's layer order (the order layers are registered in, and run forward in).
        grads = view.grad_norms
        bad = next(
            (i for i in reversed(range(len(grads))) if _non_finite(grads[i])),
            None,
        )
        if bad is not None:
            return f"grad_norm[{info.layer(bad)}]", grads[bad], BACKWARD_ORDER  # type: ignore[return-value]
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


def _first_non_finite_output(view: StepView, info: RunInfo) -> dict[str, Any]:
    """On a sampled step (activation hooks attached), the first value they count in
    forward order (an activation module's output, a layer's input) that was non-finite
    (its fraction NaN), and the last layer before it: where the value went bad, named
    at once: where the first failing field is a scalar (the loss), that layer is the
    alert's subject (the field goes in the evidence as ``field``). Empty when none."""
    for i, number in enumerate(view.activations or ()):
        if _non_finite(number) and i < len(info.activations):
            found = {"first_non_finite_output": info.activations[i][0]}
            fed_by = info.feeding_layer(i)
            if fed_by is not None:
                found["fed_by"] = fed_by
            return found
    return {}


def _non_finite(number: float | None) -> bool:
    return number is not None and not math.isfinite(number)


def _all_finite(view: StepView) -> bool:
    """True when every number the rule reads is finite: a NaN or an Inf makes the sum
    of them non-finite (as does an overflowing sum, which the walk then clears)."""
    total = sum(view.scalars.values())
    for values in (view.grad_norms, view.param_norms, view.update_ratios, view.activations):
        if type(values) is Float32List:  # read packed: floats only, none to drop
            total += sum(values)
        elif values:
            total += sum(filter(None, values))  # (None and 0.0 drop out: both finite)
    return math.isfinite(total) and (
        view.grad_norm_total is None or math.isfinite(view.grad_norm_total)
    )
