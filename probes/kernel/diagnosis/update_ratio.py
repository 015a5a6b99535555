"""Rung 5, the update's size: a layer's update against its weights (``update_ratio``).

Updates far out of proportion to the weights say the learning rate is too high or too
low, or a layer is frozen; the band depends on what the optimizer is (adaptive ones sit
higher), an adaptive optimizer's first update moves every weight by the rate, and a
ratio counts when it stays out of the band, not one early step that falls by itself.
"""

from __future__ import annotations

import math

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.rule import (
    Findings,
    Rule,
    first_failing,
    ordered_range,
    spread,
)
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView, weighted_mean
from probes.kernel.diagnosis.vocabulary import AlertKind, Evidence


class UpdateRatio(Rule):
    """Per-layer |dw|/|w| far from the usual ~1e-3 band, on sampled steps in a row.

    Too low counts only as the learning rate's doing: when most layers are low, and the
    rate is not in the tail of its schedule (a warmup's start, a decay's end: below
    ``update_low_lr_fraction`` of the run's highest), and the loss has not converged
    (a finished fit makes tiny updates: a higher rate is no advice for it). Some layers
    are low by nature (a LayerNorm's gains at a fine-tuning rate), and a layer the
    optimizer leaves alone is ``updates_not_applied``'s business."""

    kind: str = AlertKind.UPDATE_RATIO
    replicated = True  # it reads what every replica holds alike

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._samples: dict[int, int] = {}
        self._since: dict[int, int] = {}
        self._side: dict[int, str] = {}
        self._top_lr = 0.0  # the highest learning rate of the run so far
        self._sampled = False  # whether a sampled step was seen (the first is special)
        self._last: dict[int, float] = {}  # each layer's ratio on the last sampled step
        self._state: object = None  # the names the optimizer keeps (what it is)

    def _low_counts(self, view: StepView, ratios: list[float]) -> bool:
        """Whether a low ratio says the learning rate is too low, on this record."""
        lr = max((x for x in view.lrs if math.isfinite(x)), default=None)
        if lr is not None:
            self._top_lr = max(self._top_lr, lr)
            if lr < self.t.update_low_lr_fraction * self._top_lr:
                return False  # a schedule's tail: low updates are its design
        low = sum(1 for r in ratios if r < self.t.update_low)
        return 2 * low > len(ratios)

    def _converged(self, history: RecentPast, view: StepView) -> bool:
        return converged(history, view, self.t)

    def _learning(self, history: RecentPast, view: StepView) -> bool:
        """Whether the run's own loss says it learns: the smoothed training loss at
        least ``update_high_learning_drop`` below where the run began. Updates above
        the band while the loss falls that far are the rate's working size (an LSTM
        updated by hand at lr 20 under a clip of 0.25: its decoder at 0.1 to 0.17 while
        the loss halves); a rate too high keeps the loss from falling."""
        now = history.smoothed_loss(view.step, self.t.smoothing_steps)
        began = weighted_mean(
            [(s.loss_estimate, s.steps) for s in history.first_steps if s.loss_estimate is not None]
        )
        if now is None or began is None or began <= 0 or now < 0:
            return False  # no scale to judge a fall on
        return now <= (1 - self.t.update_high_learning_drop) * began

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.update_ratios is None:
            return None  # not a sampled step: no news
        if view.optimizer_state is not None:
            self._state = view.optimizer_state
        kind = family(history.info.optimizer, self._state)
        adaptive = kind == "adaptive"
        far = self.t.update_far_too_high_adaptive if adaptive else self.t.update_far_too_high
        high = self.t.update_high_adaptive if adaptive else self.t.update_high
        first_sample = not self._sampled
        self._sampled = True
        if adaptive and first_sample:
            # the adaptive optimizer's first update: the rate itself in every coordinate
            far = max(far, self.t.update_far_too_high_adaptive_first)
        if kind == "quasi_newton":
            # A line search's step over many iterations, sized by the curvature: no
            # rate's band to hold it to; only an update that replaces the weights on
            # most layers is far too high.
            measured, over = _far_layers(view, self.t.update_far_too_high_quasi_newton)
            if over and 2 * len(over) > len(measured):
                far = self.t.update_far_too_high_quasi_newton
                return [self._far_too_high(history, view, far, far, measured, over)]
            return []
        finite = [r for r in view.update_ratios if r is not None and math.isfinite(r)]
        measured, over = _far_layers(view, far)
        if over and 2 * len(over) > len(measured):
            return [self._far_too_high(history, view, far, high, measured, over)]
        learning = self._learning(history, view)
        low_counts = self._low_counts(view, finite) and not self._converged(history, view)
        found: dict[int, float] = {}
        for i, ratio in enumerate(view.update_ratios):
            side = ""
            if ratio is not None and math.isfinite(ratio):
                side = (
                    "high"
                    if ratio > high and not learning
                    else ("low" if ratio < self.t.update_low and low_counts else "")
                )
            last = self._last.get(i)
            falling = (
                side == "high"
                and last is not None
                and ratio < (1 - self.t.update_high_falling) * last  # type: ignore[operator]
            )
            if ratio is not None and math.isfinite(ratio):
                self._last[i] = ratio
            if not side or side != self._side.get(i, side) or falling:
                # (a high ratio that falls by itself is a transient: its streak starts over)
                self._samples.pop(i, None)
                self._since.pop(i, None)
                self._side.pop(i, None)
            if not side:
                continue
            self._side[i] = side
            self._samples[i] = self._samples.get(i, 0) + 1
            since = self._since.setdefault(i, view.step)  # a sampled step shows only itself
            if (
                self._samples[i] >= self.t.update_samples
                and view.step - since >= self.t.update_steps
            ):
                found[i] = ratio  # type: ignore[assignment]
        if not found:
            return []
        return [self._outside_band(history, found, high)]

    def _outside_band(self, history: RecentPast, found: dict[int, float], high: float) -> Alert:
        """The alert for the layers whose ratio stayed outside the band (``found``: each
        one's ratio now), on the first failing layer's side."""
        order = first_failing({i: self._since[i] for i in found})
        first = order[0]
        # one side per alert: the first failing layer's (its side is the evidence's)
        order = [i for i in order if self._side[i] == self._side[first]]
        names = [history.info.layer(i) for i in order]
        # held from its first sample on: judged at the step that makes update_steps
        return self.alert(
            self._since[first] + self.t.update_steps,
            names[0],
            {
                "update_ratio": found[first],
                Evidence.SIDE: self._side[first],
                "samples": self._samples[first],
                "band": f"{self.t.update_low:g}..{high:g}",
                **spread(ordered_range(names, history.info.layers)),
            },
            layers=names,
        )

    def _far_too_high(
        self,
        history: RecentPast,
        view: StepView,
        far: float,
        high: float,
        measured_at: list[int],
        over: list[int],
    ) -> Alert:
        """Most layers' updates as large as their weights on one sampled step: the
        learning rate is far too high, an error from this step on (no streak: the
        first step can show it, and the loss is gone by the time a streak would be)."""
        ratios = view.update_ratios or ()
        measured = len(measured_at)
        names = [history.info.layer(i) for i in over]  # one step: model order
        first = over[0]
        for i in over:  # the streaks of the band's rule start again after it
            self._samples.pop(i, None)
            self._since.pop(i, None)
            self._side.pop(i, None)
        return self.alert(
            view.step,
            names[0],
            {
                "update_ratio": ratios[first],
                Evidence.SIDE: "high",
                "samples": 1,
                "band": f"{self.t.update_low:g}..{high:g}",
                Evidence.FAR_TOO_HIGH: f">={far:g} on {len(over)} of {measured} layers",
                **spread(ordered_range(names, history.info.layers)),
            },
            severity=Severity.ERROR,
            layers=names,
        )


#: A layer's weights this large after one update are no zero-initialised layer's first
#: step (a LoRA ``B`` after one step is a learning rate times its gradient): an update
#: a million times the old weights, which also reads as a ratio of 1 to six places.
FROM_ZERO_MAX_NORM = 1e6


def _from_zero(ratio: float, weight_norm: float | None) -> bool:
    """A ratio of exactly 1: |w_before - w_after| is |w_after| to the last bit, so the
    weights were all zero before this update (a zero-initialised layer, a LoRA ``B``):
    it says nothing of the learning rate. (A rate far too high leaves the old weights
    in the sum: 0.93 to 1.01, not 1 to six places; unless it blew them up a million
    times over in one step, as LBFGS's inner iterations can: weights of norm
    ``FROM_ZERO_MAX_NORM`` or more after the step.)"""
    if weight_norm is not None and math.isfinite(weight_norm) and weight_norm >= FROM_ZERO_MAX_NORM:
        return False
    return abs(ratio - 1.0) < 1e-6


def _norm(view: StepView, layer: int) -> float | None:
    """The layer's weight norm after the step, where the record has it."""
    norms = view.param_norms
    return norms[layer] if norms is not None and layer < len(norms) else None


def _far_layers(view: StepView, far: float) -> tuple[list[int], list[int]]:
    """The layers measured on this sampled step (a finite ratio, not a zero-initialised
    layer's first update) and those of them at or above ``far``."""
    ratios = view.update_ratios or ()
    measured = [
        i
        for i, r in enumerate(ratios)
        if r is not None and math.isfinite(r) and not _from_zero(r, _norm(view, i))
    ]
    return measured, [i for i in measured if ratios[i] >= far]  # type: ignore[operator]


def converged(history: RecentPast, view: StepView, t: Thresholds) -> bool:
    """Whether the training loss says the fit is done, on the run's own scale (far
    below where it started) or near zero with the gradients near zero too."""
    now = history.smoothed_loss(view.step, t.smoothing_steps)
    if now is None or now < 0:
        return False  # (a loss that goes negative has no zero to converge to)
    total = view.peak_total
    if now <= t.update_converged_loss and total is not None and total <= t.update_converged_grad:
        return True
    began = weighted_mean(
        [(s.loss_estimate, s.steps) for s in history.first_steps if s.loss_estimate is not None]
    )
    return began is not None and began > 0 and now <= t.update_converged_fraction * began


#: What an optimizer keeps per parameter says what it is. A running second moment (or
#: its like) normalises each coordinate's step: adaptive (Adam's ``exp_avg_sq``,
#: Adafactor's ``exp_avg_sq_row``, RMSprop's and Adadelta's ``square_avg``, Adagrad's
#: ``sum``, Adamax's ``exp_inf``, Rprop's ``step_size``). Curvature pairs: a
#: quasi-Newton method (LBFGS's ``old_dirs``/``old_stps``), whose step is a line
#: search's over many iterations, sized by the curvature rather than by a rate.
SECOND_MOMENT_STATE = ("exp_avg_sq", "square_avg", "sum", "exp_inf", "step_size")
QUASI_NEWTON_STATE = ("old_dirs", "old_stps")
#: Before an optimizer has state (its first step), or from a probe that does not send
#: it: the class name, lower case (``AdamW``, ``FusedAdam``, ``PagedAdamW8bit``, ...).
ADAPTIVE_OPTIMIZERS = ("adam", "adadelta", "adagrad", "rmsprop", "adafactor", "lion", "lamb")


def family(optimizer: str | None, state: object = None) -> str:
    """``"adaptive"``, ``"quasi_newton"`` or ``"first_order"``: by the names the
    optimizer keeps per parameter (``state``, untrusted: a list of strings, else
    ignored), else by its class name."""
    keys = [k for k in state if isinstance(k, str)] if isinstance(state, list) else []
    if keys:
        if any(k in QUASI_NEWTON_STATE for k in keys):
            return "quasi_newton"
        if any(k.startswith(SECOND_MOMENT_STATE) for k in keys):
            return "adaptive"
        return "first_order"
    name = (optimizer or "").lower()
    if "lbfgs" in name:
        return "quasi_newton"
    return "adaptive" if any(f in name for f in ADAPTIVE_OPTIMIZERS) else "first_order"
