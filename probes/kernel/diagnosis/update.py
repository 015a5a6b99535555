"""Rung 5, the update: are gradients cleared, does optimizer.step() run, does it change
the weights, and by how much; loss spikes (the update path turning unstable).

(The watch-time checks, parameters left out of the optimizer or an optimizer built for
another model, run in the training process: ``probes.runtime.structure``.)
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.rule import (
    Findings,
    Rule,
    Streaks,
    first_failing,
    ordered_range,
    reached_at,
    spread,
)
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView, weighted_mean
from probes.kernel.diagnosis.vocabulary import AlertKind


class GradNotCleared(Rule):
    """Gradients accumulate across updates because zero_grad was not called: the first
    backward pass after an update (``optimizer.step()``, a closure call, or the end of
    a step with no optimizer) found the gradient that update used, untouched, and added
    to it (``probes.runtime.clearing``). Accumulating micro-batches between updates is
    not this: only a pass after an update is checked, whatever the loop's shape."""

    kind: str = AlertKind.GRAD_NOT_CLEARED
    severity: Severity = Severity.ERROR

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._since: int | None = None

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if history.info.grad_accumulation:
            return []
        if not view.optimizer_stepped:
            return None  # no update in this step: nothing was checked
        if not view.grads_not_cleared:
            self._since = None
            return []
        if self._since is None:
            self._since = view.first
        step = reached_at(self._since, self.t.not_cleared_steps, view)
        if step is None:
            return []
        # The probe checks the first parameter's gradient: its layer is the one seen.
        return [
            self.alert(
                step,
                "",
                {
                    "steps": view.step - self._since + 1,
                    "since_step": self._since,
                    "grad_norm_total": view.grad_norm_total,
                },
                layers=history.info.layers[:1],
            )
        ]


class UpdateRatio(Rule):
    """Per-layer |dw|/|w| far from the usual ~1e-3 band, on sampled steps in a row.

    Too low counts only as the learning rate's doing: when most layers are low, and the
    rate is not in the tail of its schedule (a warmup's start, a decay's end: below
    ``update_low_lr_fraction`` of the run's highest), and the loss has not converged
    (a finished fit makes tiny updates: a higher rate is no advice for it). Some layers
    are low by nature (a LayerNorm's gains at a fine-tuning rate), and a layer the
    optimizer leaves alone is ``updates_not_applied``'s business."""

    kind: str = AlertKind.UPDATE_RATIO

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._samples: dict[int, int] = {}
        self._since: dict[int, int] = {}
        self._side: dict[int, str] = {}
        self._top_lr = 0.0  # the highest learning rate of the run so far
        self._sampled = False  # whether a sampled step was seen (the first is special)
        self._last: dict[int, float] = {}  # each layer's ratio on the last sampled step

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
        """Whether the training loss says the fit is done, on the run's own scale (far
        below where it started) or near zero with the gradients near zero too."""
        now = history.smoothed_loss(view.step, self.t.smoothing_steps)
        if now is None or now < 0:
            return False  # (a loss that goes negative has no zero to converge to)
        total = view.peak_total
        if (
            now <= self.t.update_converged_loss
            and total is not None
            and total <= self.t.update_converged_grad
        ):
            return True
        began = weighted_mean(
            [(s.loss_estimate, s.steps) for s in history.first_steps if s.loss_estimate is not None]
        )
        return began is not None and began > 0 and now <= self.t.update_converged_fraction * began

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
        optimizer = history.info.optimizer
        adaptive = is_adaptive(optimizer)
        far = self.t.update_far_too_high_adaptive if adaptive else self.t.update_far_too_high
        high = self.t.update_high_adaptive if adaptive else self.t.update_high
        first_sample = not self._sampled
        self._sampled = True
        if adaptive and first_sample:
            # the adaptive optimizer's first update: the rate itself in every coordinate
            far = max(far, self.t.update_far_too_high_adaptive_first)
        finite = [r for r in view.update_ratios if r is not None and math.isfinite(r)]
        measured, over = _far_layers(view, far, is_multi_iteration(optimizer))
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
        order = first_failing({i: self._since[i] for i in found})
        first = order[0]
        # one side per alert: the first failing layer's (its side is the evidence's)
        order = [i for i in order if self._side[i] == self._side[first]]
        names = [history.info.layer(i) for i in order]
        # held from its first sample on: judged at the step that makes update_steps
        return [
            self.alert(
                self._since[first] + self.t.update_steps,
                names[0],
                {
                    "update_ratio": found[first],
                    "side": self._side[first],
                    "samples": self._samples[first],
                    "band": f"{self.t.update_low:g}..{high:g}",
                    **spread(ordered_range(names, history.info.layers)),
                },
                layers=names,
            )
        ]

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
                "side": "high",
                "samples": 1,
                "band": f"{self.t.update_low:g}..{high:g}",
                "far_too_high": f">={far:g} on {len(over)} of {measured} layers",
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


def _far_layers(view: StepView, far: float, multi: bool) -> tuple[list[int], list[int]]:
    """The layers measured on this sampled step (a finite ratio, not a zero-initialised
    layer's first update) and those of them at or above ``far``. One step of a
    multi-iteration optimizer (LBFGS: up to ``max_iter`` updates a ``step()``) may move
    healthy weights by their whole size (a fit from its initialisation in one step): it
    is far too high only when its update replaced the weights (a ratio of 1 to six
    places, weights of norm ``FROM_ZERO_MAX_NORM`` or more: blown up in one step)."""
    ratios = view.update_ratios or ()
    measured: list[int] = []
    over: list[int] = []
    for i, r in enumerate(ratios):
        if r is None or not math.isfinite(r) or _from_zero(r, _norm(view, i)):
            continue
        measured.append(i)
        if r >= far and (not multi or abs(r - 1.0) < 1e-6):
            over.append(i)
    return measured, over


#: Optimizers whose updates adapt to each weight's gradient history (their healthy
#: update ratios sit higher): matched in the class name, lower case (``AdamW``,
#: ``FusedAdam``, ``PagedAdamW8bit``, ``Adadelta``, ``RMSprop``, ...).
ADAPTIVE_OPTIMIZERS = ("adam", "adadelta", "adagrad", "rmsprop", "adafactor", "lion", "lamb")


def is_adaptive(optimizer: str | None) -> bool:
    """Whether an optimizer's class name is one of the adaptive family's."""
    name = (optimizer or "").lower()
    return any(family in name for family in ADAPTIVE_OPTIMIZERS)


#: Optimizers one ``step()`` of which runs several updates (LBFGS: up to ``max_iter``
#: closure evaluations and moves): matched in the class name, lower case.
MULTI_ITERATION_OPTIMIZERS = ("lbfgs",)


def is_multi_iteration(optimizer: str | None) -> bool:
    """Whether an optimizer's ``step()`` is many iterations' updates (its class name)."""
    name = (optimizer or "").lower()
    return any(family in name for family in MULTI_ITERATION_OPTIMIZERS)


class UpdatesNotApplied(Rule):
    """A layer's gradient is non-zero, yet its weights did not change across
    optimizer.step(): the probe's version check (the optimizer never touched the
    tensor), an update ratio of exactly 0 on a sampled step, or a learning rate of 0.
    Updates by hand (no optimizer, no rate) that moved a layer on an earlier sample and
    move it no more are ``lr_too_low_to_update``'s: a rate decayed to nothing."""

    kind: str = AlertKind.UPDATES_NOT_APPLIED

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streaks = Streaks()
        self._why: dict[int, str] = {}
        self._versions_trusted = True  # until a sampled step contradicts them
        self._moved: set[int] = set()  # layers a sampled ratio saw change

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if not view.optimizer_stepped or history.info.every > 1:
            return None
        versions = history.info.update_check and self._versions_trusted
        ratios = view.update_ratios
        untouched = set(view.not_stepped)
        if ratios is not None and any(
            i in untouched and r is not None and r > 0 for i, r in enumerate(ratios)
        ):
            self._versions_trusted = versions = False  # weights changed, versions did not
        lr_zero = bool(view.lrs) and all(lr == 0 for lr in view.lrs)
        if versions and not lr_zero and not untouched and ratios is None:
            return self._all_touched(view)
        reached: dict[int, int] = {}
        news = False
        for i, grad in enumerate(view.peak_grads):
            if grad is None or not math.isfinite(grad) or grad <= 0:
                continue  # no gradient to apply: no news for this layer
            ratio = None if ratios is None or i >= len(ratios) else ratios[i]
            if ratio is not None and ratio > 0:
                self._moved.add(i)
            elif ratio == 0 and not view.lrs and i in self._moved:
                continue  # by hand, moved before: the rate's (lr_too_low_to_update)
            why = (
                "lr=0"
                if lr_zero
                else "not_stepped"
                if versions and i in untouched
                else "update_ratio=0"
                if ratio == 0
                else ""
            )
            # the optimizer touched it, at some step of the span, with a learning rate
            touched = versions and not lr_zero and i not in untouched
            changed = (ratio is not None and ratio > 0) or (touched and ratio != 0)
            if not why and not changed:
                continue
            news = True
            if touched and view.steps > 1:
                self._streaks.drop(i)  # the steps before the one it shows were updated
            # a sampled ratio or the learning rate shows the record's own step; the
            # version check holds over the whole span
            since = self._streaks.update(
                i, bool(why), view, None if why == "not_stepped" else view.step
            )
            if since is None:
                continue
            self._why[i] = why
            if reached_at(since, self.t.not_applied_steps, view) is not None:
                reached[i] = since
        if not reached:
            return [] if news else None
        order = first_failing(reached)
        first = order[0]
        names = [history.info.layer(i) for i in order]
        step = reached_at(reached[first], self.t.not_applied_steps, view)
        assert step is not None
        return [
            self.alert(
                step,
                names[0],
                {
                    "grad_norm": view.peak_grads[first],
                    "evidence": self._why[first],
                    "steps": view.step - reached[first] + 1,
                    **spread(ordered_range(names, history.info.layers)),
                },
                layers=names,
            )
        ]

    def _all_touched(self, view: StepView) -> Findings:
        """The common step, every layer updated (version counters) and no sampled
        ratio to say otherwise: each layer with a gradient ends its streak."""
        streaks = self._streaks.since
        news = False
        for i, grad in enumerate(view.peak_grads):
            if grad is not None and grad > 0 and math.isfinite(grad):
                news = True
                if streaks:
                    streaks.pop(i, None)
        return [] if news else None


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

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if history.info.every > 1:
            return []  # the unmeasured steps may be the ones that update
        if view.optimizer_stepped or view.non_finite_grads != self.non_finite:
            self._since = None
            return []
        if self._since is None:
            self._since = view.first
        step = reached_at(self._since, self.threshold(), view)
        if step is None:
            return []
        return [
            self.alert(
                step,
                "",
                {
                    self.evidence_name: view.step - self._since + 1,
                    "since_step": self._since,
                    "loss": view.loss,
                },
            )
        ]


class SkippedUpdates(_UpdateStreak):
    """optimizer.step() skipped, step after step, because the gradients are non-finite."""

    kind: str = AlertKind.SKIPPED_UPDATES
    non_finite = True
    evidence_name = "skipped_steps"

    def threshold(self) -> int:
        return self.t.skipped_steps


class NoUpdates(_UpdateStreak):
    """The optimizer never steps though the gradients are fine: the weights stand still."""

    kind: str = AlertKind.NO_UPDATES
    non_finite = False
    evidence_name = "steps_without_update"

    def threshold(self) -> int:
        return self.t.no_update_steps


class LossSpike(Rule):
    """The loss jumps far above its rolling baseline (the median over the last
    ``spike_window`` steps). A thinned record that carries its steps' losses is judged
    step by step, as its steps would be unthinned (the same spike at the same step
    whatever the speed); one that does not is judged by its span's largest loss."""

    kind: str = AlertKind.LOSS_SPIKE

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._window: deque[tuple[int, float]] = deque()  # (step, loss)
        # The window's least values, ascending from the front (each one the least of the
        # window from its step on): the window's least in O(1), not a scan a record.
        self._least: deque[tuple[int, float]] = deque()
        self._start: float | None = None  # the first finite loss: the run's scale
        self._first_step: int | None = None
        self._held: Alert | None = None  # the burst's first spike, while it lasts
        self._held_until = -1

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        steps = view.losses_by_step
        if steps is None:  # a span's peaks only
            loss = view.loss_max
            if loss is None:
                return []
            shown = view.loss if view.loss is not None and math.isfinite(view.loss) else loss
            self._hold(self._judge(view.step, view.first, loss, shown))
            return self._held_now(view)
        for step, loss in steps:
            if self._held is not None and step > self._held_until:
                self._held = None  # the burst is over: the next spike is a new incident
            if math.isfinite(loss):
                self._hold(self._judge(step, step, loss, loss))
        return self._held_now(view)

    def _hold(self, found: Alert | None) -> None:
        """Spikes within ``spike_window`` steps of the last are one incident (its first):
        held until the window after the last has passed, so the same burst is one
        incident whether its spikes came in one thinned record or in several."""
        if found is None:
            return
        if self._held is None:
            self._held = found
        self._held_until = found.step + self.t.spike_window

    def _held_now(self, view: StepView) -> Findings:
        if self._held is not None and view.first > self._held_until:
            self._held = None
        return [] if self._held is None else [self._held]

    def _judge(self, step: int, first: int, loss: float, shown: float) -> Alert | None:
        """Is ``loss`` (at ``step``; a span's from ``first``) a spike over the window
        before it? Then ``shown`` joins the window."""
        window = self._window
        least = self._least
        oldest = step - self.t.spike_window
        while window and window[0][0] <= oldest:
            window.popleft()
        while least and least[0][0] <= oldest:
            least.popleft()
        if self._start is None:
            self._start = loss
            self._first_step = first
        found = None
        assert self._first_step is not None
        if (
            least
            and first - self._first_step >= self.t.spike_min_steps
            and (loss > self.t.spike_factor * least[0][1])
        ):
            # (below factor x the window's least, it is below factor x its median too)
            values = [value for _, value in window]
            median = statistics.median(values)
            deviation = statistics.median(abs(x - median) for x in values) or (abs(median) * 0.01)
            if (
                median > 0
                and loss > median * self.t.spike_factor
                and loss - median > self.t.spike_deviations * deviation
                and loss - median > self.t.spike_min_jump * abs(self._start)
            ):
                found = self.alert(
                    step, "loss", {"loss": loss, "baseline": median, "times": loss / median}
                )
        window.append((step, shown))
        if not math.isnan(shown):  # (a NaN is no bound: it never joins the least)
            while least and least[-1][1] >= shown:
                least.pop()
            least.append((step, shown))
        return found
