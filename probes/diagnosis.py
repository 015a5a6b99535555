"""Diagnosis: the lesson's layered checklist as evidence-based alerts (pure Python).

Each rule watches a run's records and says, after every record, which conditions hold
now. ``Diagnoser`` feeds the rules and turns what they say into alerts with
hysteresis: an alert is raised once, held while its condition lasts, cleared after
``clear_after`` records without it, and counted. Every alert carries its evidence
(the numbers that triggered it), one sentence on what it is a signal of and what it
does not prove, and the next controlled experiments, each changing one thing.

The rules themselves decide how long a condition must hold before they report it
(``vanishing_records``, ``update_samples``, ...).

Both the monitor (live and on replay) and headless mode run this; the thresholds are
named fields of ``Thresholds``. A healthy run raises nothing: false alarms are bugs.
This module imports no torch and no textual.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

from probes.schema import validation_loss

Severity = Literal["info", "warning", "error"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "error": 2}
Record = Mapping[str, Any]


@dataclass(frozen=True)
class Alert:
    """One diagnosis: what, how bad, where, on what evidence, and what to try next."""

    kind: str
    severity: Severity
    step: int
    subject: str  # the layer, parameter or field it concerns ("" for the run)
    evidence: dict[str, Any]
    signal: str  # what it is a signal of, and what it does not prove
    experiments: tuple[str, ...]  # the next controlled experiments, one change each
    per_subject: bool = False  # one alert per layer (else one per run)

    @property
    def key(self) -> str:
        """Identity for hysteresis: one alert per kind, or per kind and subject."""
        return f"{self.kind}:{self.subject}" if self.per_subject else self.kind

    def line(self) -> str:
        """``ALERT <severity> <kind> step=<n> <subject> key=value ...`` on one line."""
        parts = [f"ALERT {self.severity} {self.kind} step={self.step}"]
        if self.subject:
            parts.append(f"subject={self.subject}")
        parts += [f"{k}={_short(v)}" for k, v in self.evidence.items()]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "step": self.step,
                "subject": self.subject, "evidence": dict(self.evidence),
                "signal": self.signal, "experiments": list(self.experiments),
                "per_subject": self.per_subject}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        severity = str(data.get("severity", "warning"))
        return cls(
            kind=str(data["kind"]),
            severity=severity if severity in SEVERITY_ORDER else "warning",  # type: ignore[arg-type]
            step=int(data.get("step", 0)),
            subject=str(data.get("subject", "")),
            evidence=dict(data.get("evidence") or {}),
            signal=str(data.get("signal", "")),
            experiments=tuple(str(e) for e in data.get("experiments") or ()),
            per_subject=bool(data.get("per_subject", False)),
        )


def _short(value: Any) -> str:
    """A value as one word of an alert line (lists joined by commas, spaces as _)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(_short(item) for item in value)
    return str(value).replace(" ", "_")


@dataclass(frozen=True)
class Thresholds:
    """Every threshold the rules use, with the reason for its default."""

    # exploding_gradient: the seed's example uses 100 for the total norm.
    exploding_norm: float = 100.0
    exploding_growth: float = 50.0  # x over the window's smallest norm
    exploding_growth_floor: float = 10.0  # growth counts only for norms above this
    exploding_window: int = 10  # step records
    # vanishing_gradient: a layer's gradient this much smaller than the largest layer's,
    # or than its own weights (while also well below the largest layer's: a model that
    # has converged everywhere is not vanishing), for this many step records in a row.
    vanishing_to_largest: float = 1e-4
    vanishing_to_weight: float = 1e-8
    vanishing_to_largest_with_weight: float = 1e-2
    vanishing_records: int = 20
    # overfitting_signal: validation above its best by this fraction while the smoothed
    # training loss fell by this fraction since that best.
    overfit_val_rise: float = 0.10
    overfit_rising_evals: int = 2  # ... on this many evals in a row,
    overfit_val_jump: float = 0.50  # ... or this far above its best at once
    overfit_train_drop: float = 0.10
    overfit_min_evals: int = 3
    # The train loss is smoothed over this many steps (at least 3 records: on a fast,
    # thinned run one record stands for many steps, and a window counted in records
    # would reach back to the start of the run).
    smoothing_steps: int = 20
    # flat_loss: after this many steps, the smoothed loss is not this fraction below
    # where it started.
    flat_after_steps: int = 200
    flat_min_drop: float = 0.10
    # none_gradients: held for this many step records; grad_not_cleared: for this many
    # sampled steps (the probe checks the clearing around sampled steps only).
    none_grad_records: int = 3
    not_cleared_records: int = 2
    # skipped_updates: optimizer.step() skipped with non-finite gradients for this many
    # steps in a row (GradScaler skips a few at the start while it finds its scale).
    skipped_steps: int = 10
    # no_updates: optimizer.step() not run, gradients finite, for this many steps in a
    # row (gradient accumulation steps the optimizer every few steps, not every 100).
    no_update_steps: int = 100
    # update_ratio: |dw|/|w| per layer outside [low, high] (the usual band is ~1e-3) on
    # this many sampled steps in a row.
    update_high: float = 0.1
    update_low: float = 1e-5
    update_samples: int = 3
    # dead / saturated activations, on this many sampled steps in a row.
    dead_fraction: float = 0.95
    saturated_fraction: float = 0.90
    activation_samples: int = 2
    # loss_spike: the loss this many times its rolling median, and this many median
    # absolute deviations above it.
    spike_factor: float = 4.0
    spike_deviations: float = 12.0
    spike_min_jump: float = 0.01  # ... and a jump of at least this fraction of the start loss
    spike_window: int = 50
    spike_min_records: int = 20
    # hysteresis
    clear_after: int = 3

    def with_overrides(self, **overrides: float) -> Thresholds:
        """A copy with some thresholds changed (unknown names raise ``TypeError``)."""
        defaults = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = set(overrides) - set(defaults)
        if unknown:
            raise TypeError(f"unknown thresholds: {', '.join(sorted(unknown))}")
        typed: dict[str, Any] = {}
        for name, value in overrides.items():
            if isinstance(defaults[name], int) and float(value) != int(value):
                raise ValueError(f"threshold {name} counts records: a whole number, got "
                                 f"{value}")
            typed[name] = type(defaults[name])(value)  # counts stay ints (window sizes)
        return replace(self, **typed)


# --- the records, as the rules see them -----------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """What the hello says about the run (layer names, activations, ...)."""

    layers: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    activations: tuple[tuple[str, str], ...] = ()  # (module name, "relu" | "tanh" | ...)
    mode_sensitive: int = 0  # dropout and batch-norm modules
    grad_accumulation: bool = False
    every: int = 1  # the probe measures one step in this many

    @classmethod
    def from_hello(cls, hello: Record) -> RunInfo:
        activations = tuple((str(a[0]), str(a[1])) for a in hello.get("activations") or ())
        return cls(
            layers=tuple(str(n) for n in hello.get("layers") or ()),
            params=tuple(str(n) for n in hello.get("params") or ()),
            activations=activations,
            mode_sensitive=int(hello.get("mode_sensitive_modules", 0) or 0),
            grad_accumulation=bool((hello.get("config") or {}).get("grad_accumulation")),
            every=max(1, int((hello.get("config") or {}).get("every", 1) or 1)),
        )

    def layer(self, index: int) -> str:
        return self.layers[index] if 0 <= index < len(self.layers) else f"layer {index}"


@dataclass(frozen=True)
class StepView:
    """The numbers of one step record that the rules read."""

    step: int
    loss: float | None
    scalars: Mapping[str, float]
    grad_norm_total: float | None
    grad_norms: Sequence[float | None]
    param_norms: Sequence[float | None] | None
    update_ratios: Sequence[float | None] | None
    activations: Sequence[float | None] | None
    none_grad_params: Sequence[int]
    grads_not_cleared: bool
    optimizer_stepped: bool = True  # False: optimizer.step() never ran in this step

    @property
    def non_finite_grads(self) -> bool:
        """True if the step's gradient norms hold a NaN or Inf."""
        total = self.grad_norm_total
        if total is not None and not math.isfinite(total):
            return True
        return any(g is not None and not math.isfinite(g) for g in self.grad_norms)

    @classmethod
    def from_record(cls, record: Record) -> StepView:
        scalars = {str(k): as_number(v) for k, v in (record.get("scalars") or {}).items()}
        loss = scalars.get("loss", next(iter(scalars.values()), None))
        return cls(
            step=int(record.get("step", 0)),
            loss=loss,
            scalars=scalars,
            grad_norm_total=_opt_num(record.get("grad_norm_total")),
            grad_norms=[_opt_num(g) for g in record.get("grad_norms") or ()],
            param_norms=_opt_list(record.get("param_norms")),
            update_ratios=_opt_list(record.get("update_ratios")),
            activations=_opt_list(record.get("activations")),
            none_grad_params=[int(i) for i in record.get("none_grad_params") or ()],
            grads_not_cleared=bool(record.get("grads_not_cleared")),
            optimizer_stepped=record.get("optimizer_step", True) is not False,
        )


@dataclass(frozen=True)
class EvalView:
    """The numbers of one eval record that the rules read."""

    step: int
    loss: float | None
    scalars: Mapping[str, float]
    forwards: int
    train_mode_forwards: int
    grad_forwards: int

    @classmethod
    def from_record(cls, record: Record) -> EvalView:
        scalars = {str(k): as_number(v) for k, v in (record.get("scalars") or {}).items()}
        loss = validation_loss(scalars)
        return cls(
            step=int(record.get("step", 0)),
            loss=loss,
            scalars=scalars,
            forwards=int(record.get("forwards", 0) or 0),
            train_mode_forwards=int(record.get("train_mode_forwards", 0) or 0),
            grad_forwards=int(record.get("grad_forwards", 0) or 0),
        )


def as_number(value: Any) -> float:
    """A record's number as a float; NaN for anything that is not one (inf for an
    integer too large for a float)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def mean(values: Sequence[float]) -> float:
    """The mean of finite floats, without the overflow of their sum near float max."""
    count = len(values)
    return math.fsum(v / count for v in values)




def _opt_num(value: Any) -> float | None:
    return None if value is None else as_number(value)


def _opt_list(values: Any) -> list[float | None] | None:
    return None if values is None else [_opt_num(v) for v in values]


@dataclass
class RunHistory:
    """The bounded recent past the rules look at."""

    info: RunInfo
    steps: deque[StepView] = field(default_factory=lambda: deque(maxlen=256))
    evals: deque[EvalView] = field(default_factory=lambda: deque(maxlen=256))
    first_steps: list[StepView] = field(default_factory=list)  # the run's start, kept

    MIN_RECORDS: ClassVar[int] = 3  # a smoothed loss averages at least this many records

    def add_step(self, view: StepView, keep_first: int) -> None:
        self.steps.append(view)
        if len(self.first_steps) < keep_first:
            self.first_steps.append(view)

    def recent_losses(self, up_to_step: int, steps: int, after_step: int = -1) -> list[float]:
        """Finite training losses of the records in the last ``steps`` steps at or before
        ``up_to_step`` (and after ``after_step``); at least the last ``MIN_RECORDS``."""
        records = [(s.step, s.loss) for s in self.steps
                   if after_step < s.step <= up_to_step and s.loss is not None
                   and math.isfinite(s.loss)]
        recent = [loss for step, loss in records if step > up_to_step - steps]
        if len(recent) < self.MIN_RECORDS:
            recent = [loss for _, loss in records[-self.MIN_RECORDS:]]
        return recent

    def smoothed_loss(self, up_to_step: int, steps: int) -> float | None:
        """Mean of ``recent_losses``: the smoothed training loss at a step."""
        values = self.recent_losses(up_to_step, steps)
        return mean(values) if values else None


# --- the rules --------------------------------------------------------------------------

Findings = list[Alert] | None  # None: this record says nothing new to this rule


class Rule:
    """A check over a run's history; ``observe`` returns the findings that hold now."""

    kind = "rule"
    severity: Severity = "warning"
    signal = ""
    experiments: tuple[str, ...] = ()
    per_subject = False  # one alert per layer rather than one per run

    def __init__(self, thresholds: Thresholds) -> None:
        self.t = thresholds

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        return None

    def on_eval(self, history: RunHistory, view: EvalView) -> Findings:
        return None

    def alert(self, step: int, subject: str, evidence: dict[str, Any],
              severity: Severity | None = None, signal: str | None = None) -> Alert:
        return Alert(self.kind, severity or self.severity, step, subject, evidence,
                     signal or self.signal, self.experiments, self.per_subject)


class NonFinite(Rule):
    """Any numeric field of a record is NaN or Inf: the seed's finite check, every field."""

    kind = "non_finite"
    severity: Severity = "error"
    signal = ("A NaN or Inf reached the run's numbers: from here on updates are garbage. It "
              "says where it was first seen, not which operation produced it.")
    experiments = (
        "Run one step under anomaly mode (detect_anomaly) to find the op that made it.",
        "Lower the learning rate alone (e.g. 10x) and rerun from the last good checkpoint.",
        "Check the inputs and targets of the failing batch for NaN/Inf or extreme values.",
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._first: Alert | None = None
        self._step_found: tuple[str, float] | None = None
        self._eval_found: tuple[str, float] | None = None

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        self._step_found = _first_non_finite_step_field(view, history.info)
        return self._hold(view.step, self._step_found or self._eval_found)

    def on_eval(self, history: RunHistory, view: EvalView) -> Findings:
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
    for name, value in view.scalars.items():
        if not math.isfinite(value):
            return name, value
    # Non-finite gradients that never reached optimizer.step() left the weights alone:
    # AMP's GradScaler skips such steps by design (skipped_updates judges a streak).
    grads_applied = view.optimizer_stepped
    if grads_applied and view.non_finite_grads:
        bad = next((i for i, g in enumerate(view.grad_norms)
                    if g is not None and not math.isfinite(g)), None)
        if bad is not None:
            return f"grad_norm[{info.layer(bad)}]", view.grad_norms[bad]  # type: ignore[return-value]
        return "grad_norm_total", view.grad_norm_total
    for label, values in (("grad_norm", view.grad_norms if grads_applied else None),
                          ("param_norm", view.param_norms),
                          ("update_ratio", view.update_ratios)):
        for i, value in enumerate(values or ()):
            if value is not None and not math.isfinite(value):
                return f"{label}[{info.layer(i)}]", value
    for i, value in enumerate(view.activations or ()):
        if value is not None and not math.isfinite(value):
            name = info.activations[i][0] if i < len(info.activations) else f"activation {i}"
            return f"activation[{name}]", value
    return None


class ExplodingGradient(Rule):
    """Gradient norm above an absolute bound, or grown by a large factor over a short
    window; names the layer that crossed first."""

    kind = "exploding_gradient"
    severity: Severity = "error"
    signal = ("Gradient norms are blowing up: the update path is unstable. It does not say "
              "why: learning rate, initialisation, data scale or architecture.")
    experiments = (
        "Lower the learning rate alone by 10x; nothing else changes.",
        "Keep the learning rate and clip at a norm near the healthy values (log the "
        "unclipped norm with probes.clip_grad_norm_).",
        "Check the scale of inputs and targets of the batches where it began.",
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._norms: dict[int, deque[float]] = {}
        self._total: deque[float] = deque(maxlen=thresholds.exploding_window)
        self._crossed: dict[int, tuple[int, float, float]] = {}  # layer -> (step, norm, x)

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        for i, norm in enumerate(view.grad_norms):
            if norm is None or not math.isfinite(norm):
                continue  # non-finite is the other rule's business
            window = self._norms.setdefault(i, deque(maxlen=self.t.exploding_window))
            growth = norm / min(window) if window and min(window) > 0 else 1.0
            if norm > self.t.exploding_norm or (
                    growth >= self.t.exploding_growth and norm > self.t.exploding_growth_floor):
                self._crossed.setdefault(i, (view.step, norm, growth))
            else:
                self._crossed.pop(i, None)
            window.append(norm)
        total = view.grad_norm_total
        total_growth = 1.0
        if total is not None and math.isfinite(total):
            if self._total and min(self._total) > 0:
                total_growth = total / min(self._total)
            self._total.append(total)
        if self._crossed:
            layer = min(self._crossed, key=lambda i: (self._crossed[i][0], -self._crossed[i][2]))
            step, norm, growth = self._crossed[layer]
            return [self.alert(view.step, history.info.layer(layer), {
                "grad_norm": norm, "growth": growth, "since_step": step,
                "grad_norm_total": total if total is not None else math.nan,
                "layers_over": len(self._crossed)})]
        if total is not None and math.isfinite(total) and (
                total > self.t.exploding_norm or (total_growth >= self.t.exploding_growth
                                                  and total > self.t.exploding_growth_floor)):
            return [self.alert(view.step, "total", {"grad_norm_total": total,
                                                    "growth": total_growth})]
        return []


class VanishingGradient(Rule):
    """Layers whose gradients are tiny next to the largest layer's or to their own
    weights, for many records in a row."""

    kind = "vanishing_gradient"
    signal = ("These layers barely receive gradient, so they barely learn (typical of the "
              "early layers of a deep sigmoid or tanh stack). It does not prove they are "
              "useless or that the model cannot fit.")
    experiments = (
        "Swap the saturating activation for ReLU/GELU alone, same depth and optimizer.",
        "Add normalisation (LayerNorm/BatchNorm) or residual connections, nothing else.",
        "Re-initialise with a variance-preserving scheme (Xavier for tanh, Kaiming for ReLU).",
    )

    per_subject = True

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streak: dict[int, int] = {}
        self._last_params: Sequence[float | None] | None = None

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        if view.param_norms is not None:
            self._last_params = view.param_norms
        finite = [g for g in view.grad_norms if g is not None and math.isfinite(g)]
        if len(finite) < 2 and self._last_params is None:
            return []
        largest = max(finite, default=0.0)
        findings = []
        for i, norm in enumerate(view.grad_norms):
            if norm is None or not math.isfinite(norm):
                self._streak.pop(i, None)
                continue
            to_largest = norm / largest if largest > 0 else 1.0
            weight = self._weight(i)
            to_weight = norm / weight if weight else math.inf
            tiny = (len(finite) >= 2 and to_largest < self.t.vanishing_to_largest) or (
                to_weight < self.t.vanishing_to_weight
                and (len(finite) < 2 or to_largest < self.t.vanishing_to_largest_with_weight))
            self._streak[i] = self._streak.get(i, 0) + 1 if tiny else 0
            if self._streak[i] >= self.t.vanishing_records:
                findings.append(self.alert(view.step, history.info.layer(i), {
                    "grad_norm": norm, "to_largest_layer": to_largest,
                    "to_weight_norm": to_weight, "records": self._streak[i]}))
        return findings

    def _weight(self, index: int) -> float | None:
        if self._last_params is None or index >= len(self._last_params):
            return None
        return self._last_params[index]


class OverfittingSignal(Rule):
    """Training loss falling while validation loss rises, over smoothed windows."""

    kind = "overfitting_signal"
    signal = ("Training loss falls while validation loss rises: a signal of overfitting, "
              "not proof of its cause (leakage, a shifted validation set or a changed "
              "learning rate look the same, and a small validation set is noisy).")
    experiments = (
        "Add one regulariser (weight decay or dropout) and rerun; nothing else changes.",
        "Train on more (or augmented) data with the same model and schedule.",
        "Check the validation split for shift or leakage against training (check_split).",
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._train_at: dict[int, float | None] = {}  # smoothed train loss at each eval

    def on_eval(self, history: RunHistory, view: EvalView) -> Findings:
        self._train_at.setdefault(
            view.step, history.smoothed_loss(view.step, self.t.smoothing_steps))
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
        return [self.alert(latest.step, "", {
            "val_loss": latest.loss, "best_val_loss": best.loss, "best_at_step": best.step,
            "train_loss_then": train_then, "train_loss_now": train_now})]

    def _validation_rose(self, evals: list[EvalView], best: EvalView) -> bool:
        """The latest evals rose above the best: by ``overfit_val_rise`` on the last
        ``overfit_rising_evals`` evals in a row, or by ``overfit_val_jump`` at once. One
        noisy eval (a small validation set) is not a rise."""
        assert best.loss is not None
        after = evals[evals.index(best) + 1:]
        latest = after[-1].loss
        assert latest is not None
        if latest > best.loss * (1 + self.t.overfit_val_jump):
            return True
        last = after[-self.t.overfit_rising_evals:]
        return len(last) == self.t.overfit_rising_evals and all(
            e.loss is not None and e.loss > best.loss * (1 + self.t.overfit_val_rise)
            for e in last)


class FlatLoss(Rule):
    """Training loss not decreasing: after a while, still where it started."""

    kind = "flat_loss"
    signal = ("The training loss has not come down from where it started: the model is not "
              "learning. It does not say whether the wiring, the optimisation or the data "
              "is at fault.")
    experiments = (
        "Overfit a tiny batch (a few examples) with regularisers off (probes.overfit_batch).",
        "Check that gradients reach every layer, then change the learning rate alone "
        "(10x up and 10x down).",
        "Check labels, shapes and the loss contract on one batch (probes.check_batch).",
    )
    START_RECORDS = 3  # the loss "where it started": the first records of the run

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._flat = False

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        start = [s.loss for s in history.first_steps[: self.START_RECORDS]
                 if s.loss is not None and math.isfinite(s.loss)]
        if view.step < self.t.flat_after_steps or not start:
            return None
        began = mean(start)
        start_end = history.first_steps[min(self.START_RECORDS, len(history.first_steps)) - 1]
        recent = history.recent_losses(view.step, self.t.smoothing_steps,
                                       after_step=start_end.step)
        if len(recent) < 2 or began <= 0:
            return []
        now = mean(recent)
        # Hysteresis on the value itself: once flat, the loss must fall half as far
        # again before the alert clears, so noise at the line does not flap it.
        drop = self.t.flat_min_drop * (1.5 if self._flat else 1.0)
        self._flat = now >= began * (1 - drop)
        if not self._flat:
            return []
        return [self.alert(view.step, "", {"loss_at_start": began, "loss_now": now,
                                           "steps": view.step})]


class NoneGradients(Rule):
    """Trainable parameters whose ``.grad`` stays None after backward."""

    kind = "none_gradients"
    signal = ("These trainable parameters get no gradient: an unused module or a detached "
              "branch. It does not prove a bug if the module is meant to be idle.")
    experiments = (
        "Freeze the parameters (requires_grad=False) if they are meant to be idle; "
        "nothing else.",
        "Look for .detach(), .item() or torch.no_grad() on the path from these modules "
        "to the loss.",
        "Check that the module is called in forward (a branch behind a condition?).",
    )
    raise_after = 1

    per_subject = True

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streak = 0
        self._missing: tuple[int, ...] = ()

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        missing = tuple(view.none_grad_params)
        self._streak = self._streak + 1 if missing and missing == self._missing else (
            1 if missing else 0)
        self._missing = missing
        if self._streak < self.t.none_grad_records:
            return []
        names = [history.info.params[i] if i < len(history.info.params) else f"param {i}"
                 for i in missing]
        subject = _common_prefix(names)
        return [self.alert(view.step, subject, {"params": len(names),
                                                "names": ", ".join(names[:6]),
                                                "records": self._streak})]


def _common_prefix(names: Sequence[str]) -> str:
    parts = [n.split(".") for n in names]
    common: list[str] = []
    for group in zip(*parts, strict=False):
        if len(set(group)) != 1:
            break
        common.append(group[0])
    if len(names) == 1:
        return names[0]
    return ".".join(common) or names[0]


class _UpdateStreak(Rule):
    """Steps in a row whose optimizer.step() never ran and whose gradients are
    non-finite (``non_finite``) or finite; found once the streak is ``threshold`` long."""

    non_finite: bool
    evidence_name: str

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._since: int | None = None  # the first step of the current streak

    def threshold(self) -> int:
        raise NotImplementedError

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        if history.info.every > 1:
            return []  # the unmeasured steps may be the ones that update
        if view.optimizer_stepped or view.non_finite_grads != self.non_finite:
            self._since = None
            return []
        if self._since is None:
            self._since = view.step
        length = view.step - self._since + 1
        if length < self.threshold():
            return []
        return [self.alert(view.step, "", {self.evidence_name: length,
                                           "since_step": self._since, "loss": view.loss})]


class SkippedUpdates(_UpdateStreak):
    """optimizer.step() skipped, step after step, because the gradients are non-finite."""

    kind = "skipped_updates"
    signal = ("The optimizer has not stepped for a while because every gradient is "
              "non-finite: a GradScaler skipping each update while its loss scale keeps "
              "falling. A few skips are normal under AMP; a streak means the gradients are "
              "non-finite at any scale.")
    experiments = (
        "Run one step under anomaly mode (a) to find the op that makes the gradient "
        "non-finite.",
        "Compute the loss in float32 (outside autocast) and check scaler.get_scale().",
        "Check the inputs and targets of these batches for NaN/Inf or extreme values.",
    )
    non_finite = True
    evidence_name = "skipped_steps"

    def threshold(self) -> int:
        return self.t.skipped_steps


class NoUpdates(_UpdateStreak):
    """The optimizer never steps though the gradients are fine: the weights stand still."""

    kind = "no_updates"
    signal = ("optimizer.step() has not run for many steps while the gradients are finite: "
              "the weights are not changing, whatever the loss does. It does not say "
              "whether the call is missing or skipped on purpose.")
    experiments = (
        "Check that optimizer.step() runs every step (not behind a condition or after "
        "the loop).",
        "If you accumulate gradients over more steps on purpose, raise no_update_steps.",
        "Check that the optimizer holds this model's parameters (not a copy's).",
    )
    non_finite = False
    evidence_name = "steps_without_update"

    def threshold(self) -> int:
        return self.t.no_update_steps


class GradNotCleared(Rule):
    """Gradients accumulate across steps because zero_grad was not called."""

    kind = "grad_not_cleared"
    severity: Severity = "error"
    signal = ("Gradients from earlier steps are still there when the next backward adds "
              "to them: every update uses a growing sum. Intended only with declared "
              "gradient accumulation.")
    experiments = (
        "Call optimizer.zero_grad(set_to_none=True) once per step, before backward.",
        "If you accumulate on purpose, declare it: probes.watch(..., grad_accumulation=True).",
        "Compare the gradient norms of two consecutive steps on the same batch: they "
        "should match, not double.",
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streak = 0

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        if history.info.grad_accumulation:
            return []
        if view.param_norms is None:
            return None  # not a sampled step: the probe checked nothing here
        self._streak = self._streak + 1 if view.grads_not_cleared else 0
        if self._streak < self.t.not_cleared_records:
            return []
        return [self.alert(view.step, "", {"records": self._streak,
                                           "grad_norm_total": view.grad_norm_total})]


class UpdateRatio(Rule):
    """Per-layer |dw|/|w| far from the usual ~1e-3 band, on sampled steps."""

    kind = "update_ratio"
    signal = ("Updates are far out of proportion to the weights: too large suggests the "
              "learning rate is too high, too small that it is too low or that the layer "
              "is frozen. A rule of thumb, not a law: some layers differ.")
    experiments = (
        "Change the learning rate alone toward the band (x0.1 if too high, x10 if too low).",
        "Check that this layer's parameters are in the optimizer's param groups.",
        "Compare with a per-layer learning rate for this layer only.",
    )

    per_subject = True

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streak: dict[int, int] = {}

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        if view.update_ratios is None:
            return None  # not a sampled step: no news
        findings = []
        for i, ratio in enumerate(view.update_ratios):
            if ratio is None or not math.isfinite(ratio):
                self._streak.pop(i, None)
                continue
            side = "high" if ratio > self.t.update_high else (
                "low" if ratio < self.t.update_low else "")
            self._streak[i] = self._streak.get(i, 0) + 1 if side else 0
            if side and self._streak[i] >= self.t.update_samples:
                findings.append(self.alert(view.step, history.info.layer(i), {
                    "update_ratio": ratio, "side": side, "samples": self._streak[i],
                    "band": f"{self.t.update_low:g}..{self.t.update_high:g}"}))
        return findings


class Activations(Rule):
    """Dead ReLUs (outputs exactly zero) or saturated tanh/sigmoid, on sampled steps."""

    kind = "dead_activations"

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streak: dict[int, int] = {}

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        if view.activations is None:
            return None
        findings = []
        for i, fraction in enumerate(view.activations):
            if fraction is None or i >= len(history.info.activations):
                continue
            name, family = history.info.activations[i]
            dead = family == "relu"
            limit = self.t.dead_fraction if dead else self.t.saturated_fraction
            self._streak[i] = self._streak.get(i, 0) + 1 if fraction >= limit else 0
            if self._streak[i] >= self.t.activation_samples:
                findings.append(_activation_alert(view.step, name, family, fraction,
                                                  self._streak[i]))
        return findings


_DEAD_EXPERIMENTS = (
    "Lower the learning rate alone: large updates push units into the dead region.",
    "Swap ReLU for LeakyReLU/GELU in this layer only.",
    "Re-initialise this layer (Kaiming) or add normalisation before it, one at a time.",
)
_SATURATED_EXPERIMENTS = (
    "Normalise the inputs of this layer (scale, LayerNorm) alone.",
    "Swap the activation for ReLU/GELU in this layer only.",
    "Re-initialise with smaller weights (Xavier) and compare the fraction.",
)


def _activation_alert(step: int, name: str, family: str, fraction: float,
                      samples: int) -> Alert:
    if family == "relu":
        return Alert("dead_activations", "warning", step, name,
                     {"zero_fraction": fraction, "samples": samples},
                     "Most outputs of this ReLU are exactly zero: those units pass no "
                     "gradient and no longer learn. It does not prove the layer is "
                     "useless: it may be sparse by design.", _DEAD_EXPERIMENTS, True)
    return Alert("saturated_activations", "warning", step, name,
                 {"saturated_fraction": fraction, "samples": samples},
                 f"Most outputs of this {family} sit at its flat ends, where the gradient "
                 "is near zero. It does not prove the layer cannot learn, only that it "
                 "learns slowly now.", _SATURATED_EXPERIMENTS, True)


class EvalMode(Rule):
    """Validation run in training mode, or with gradient recording on: two alerts,
    because ``model.eval()`` and ``torch.inference_mode()`` are orthogonal controls."""

    kind = "eval_in_train_mode"

    def on_eval(self, history: RunHistory, view: EvalView) -> Findings:
        findings = []
        if view.train_mode_forwards:
            sensitive = history.info.mode_sensitive
            findings.append(Alert(
                "eval_in_train_mode", "error" if sensitive else "warning", view.step, "",
                {"forwards_in_train_mode": view.train_mode_forwards,
                 "forwards": view.forwards, "dropout_or_batchnorm_modules": sensitive},
                "Validation ran with model.training True: dropout and batch norm behave "
                "as in training, so the validation numbers are not the model's. It does "
                "not say the training itself is wrong.",
                ("Call model.eval() before validation and model.train() after; nothing else.",
                 "Re-run the same validation both ways and compare the loss.",
                 "Check every forward in the eval loop, helpers included, for mode.")))
        if view.grad_forwards:
            findings.append(Alert(
                "eval_with_grad", "warning", view.step, "",
                {"forwards_with_grad": view.grad_forwards, "forwards": view.forwards},
                "Validation recorded gradients (no torch.inference_mode / no_grad): it "
                "costs memory and time and can leak graph references. It does not change "
                "the numbers; eval mode is a separate switch.",
                ("Wrap validation in torch.inference_mode(); nothing else.",
                 "Compare peak memory of one validation pass with and without it.",
                 "Check that no validation tensor is kept across steps (a growing graph).")))
        return findings


class LossSpike(Rule):
    """The loss jumps far above its rolling baseline."""

    kind = "loss_spike"
    signal = ("The loss jumped far above its recent level (and by a visible part of where "
              "it started): a bad batch, an outlier or the start of instability. One spike "
              "is not divergence.")
    experiments = (
        "Inspect the batch of that step: inputs, labels, any extreme values.",
        "Rerun the same steps with a lower learning rate alone.",
        "Rerun with a different data order (seed) alone: does the spike follow the batch?",
    )

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._window: deque[float] = deque(maxlen=thresholds.spike_window)
        self._start: float | None = None  # the first finite loss: the run's scale

    def on_step(self, history: RunHistory, view: StepView) -> Findings:
        loss = view.loss
        if loss is None or not math.isfinite(loss):
            return []
        window = self._window
        findings: list[Alert] = []
        if self._start is None:
            self._start = loss
        if len(window) >= self.t.spike_min_records:
            median = statistics.median(window)
            deviation = statistics.median(abs(x - median) for x in window) or abs(median) * 0.01
            if (median > 0 and loss > median * self.t.spike_factor
                    and loss - median > self.t.spike_deviations * deviation
                    and loss - median > self.t.spike_min_jump * abs(self._start)):
                findings.append(self.alert(view.step, "loss", {
                    "loss": loss, "baseline": median, "times": loss / median}))
        window.append(loss)
        return findings


# Order matters when several alerts rise on one record: the growth that led to a
# non-finite value is reported before the non-finite value itself.
RULES: tuple[type[Rule], ...] = (
    ExplodingGradient, NonFinite, VanishingGradient, OverfittingSignal, FlatLoss,
    NoneGradients, GradNotCleared, UpdateRatio, Activations, EvalMode, LossSpike,
    SkippedUpdates, NoUpdates,
)


# --- hysteresis -------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertChange:
    """An alert raised or cleared."""

    alert: Alert
    raised: bool  # False: cleared


class Diagnoser:
    """Feed a run's records; get alerts raised once and cleared when their condition ends.

    Args:
        info: what the run's hello says (layer names, activations, ...).
        thresholds: every rule's thresholds.

    Example::

        diagnoser = Diagnoser(RunInfo.from_hello(hello))
        for record in records:
            for change in diagnoser.observe(record):
                print(("RAISED " if change.raised else "cleared ") + change.alert.line())
    """

    def __init__(self, info: RunInfo | None = None,
                 thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self.history = RunHistory(info or RunInfo())
        self.rules = [rule(self.thresholds) for rule in RULES]
        self.active: dict[str, Alert] = {}
        self.raised_count: dict[str, int] = {}
        self._findings: dict[int, list[Alert]] = {}
        self._absent: dict[str, int] = {}

    def observe(self, record: Record) -> list[AlertChange]:
        """Take one step or eval record; return the alerts raised or cleared by it."""
        kind = record.get("kind")
        if kind == "step":
            view = StepView.from_record(record)
            self.history.add_step(view, keep_first=self.thresholds.smoothing_steps)
            for index, rule in enumerate(self.rules):
                self._update(index, rule.on_step(self.history, view))
        elif kind == "eval":
            eval_view = EvalView.from_record(record)
            self.history.evals.append(eval_view)
            for index, rule in enumerate(self.rules):
                self._update(index, rule.on_eval(self.history, eval_view))
        else:
            return []
        return self._settle()

    def _update(self, index: int, findings: Findings) -> None:
        if findings is not None:
            self._findings[index] = findings

    def _settle(self) -> list[AlertChange]:
        """Raise what is newly found; clear what has been absent for ``clear_after``
        records. (Rules require their own 'sustained for N records' before finding.)"""
        current = {a.key: a for findings in self._findings.values() for a in findings}
        changes: list[AlertChange] = []
        for key, alert in current.items():
            self._absent.pop(key, None)
            if key not in self.active:
                self.active[key] = alert
                self.raised_count[alert.kind] = self.raised_count.get(alert.kind, 0) + 1
                changes.append(AlertChange(alert, raised=True))
        for key, alert in list(self.active.items()):
            if key in current:
                continue
            self._absent[key] = self._absent.get(key, 0) + 1
            if self._absent[key] >= self.thresholds.clear_after:
                del self.active[key]
                del self._absent[key]
                changes.append(AlertChange(alert, raised=False))
        return changes


def worst_severity(alerts: Sequence[Alert]) -> Severity | None:
    """The most severe of ``alerts`` (None for none)."""
    if not alerts:
        return None
    return max((a.severity for a in alerts), key=SEVERITY_ORDER.__getitem__)


def at_least(severity: str, threshold: str) -> bool:
    """True if ``severity`` is ``threshold`` or worse."""
    return SEVERITY_ORDER[severity] >= SEVERITY_ORDER[threshold]
