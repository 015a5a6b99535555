"""Rung 4, the gradient path: an explosion, growth against the run's own recent level
(or, where the loss's scale does not explain them, the seed's bound on the norms),
naming the layer that crossed first."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.rule import Findings, Rule, first_failing, ordered_range
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class ExplodingGradient(Rule):
    """A layer's gradient norm above an absolute bound, or grown by a large factor over
    the last few steps; names the layer that crossed first (the peak of a record that
    stands for several steps counts).

    The bound gives way to the run's own scale: a run already above it at its first
    record, with a loss at least as large as its total norm (a loss summed over pixels
    has gradients in the thousands from step 0), is judged at once by growth alone when
    the probe read a summed reduction off the loss's autograd node, else against
    growth alone (no absolute bound) once its loss has fallen by
    ``exploding_start_drop`` within ``exploding_start_steps`` (it trains at that
    scale); a run whose loss has not by then is held to the absolute bound again (data
    in raw units: a mean loss in the tens of thousands that does not move).
    Gradients still multiplied by a GradScaler's scale are not judged at all
    (``grads_still_scaled`` says so)."""

    kind: str = AlertKind.EXPLODING_GRADIENT
    replicated = True  # it reads what every replica holds alike
    severity: Severity = Severity.ERROR

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        # The last records' per-layer norms, kept whole (step, peaks, shown): the
        # common step, every layer below the bounds, then costs no work per layer.
        self._recent: deque[tuple[int, Sequence[float | None], Sequence[float | None]]] = deque()
        self._total: deque[tuple[int, float]] = deque()
        self._crossed: dict[int, tuple[int, float, float]] = {}  # layer -> (step, norm, x)
        # The run's own scale: its first record's norms and loss; ``_own_scale`` is
        # False (the absolute bound), None (above it from the start, not yet judged) or
        # True (it trains at that scale: bounds relative to the first norms).
        self._own_scale: bool | None = False
        self._start: Sequence[float | None] = ()
        self._start_total: float | None = None
        self._start_loss: float | None = None
        self._seen = False
        self._start_step = 0
        self._start_over: list[int] = []  # layers above the bound at the first record
        self._first_step: int | None = None  # the run's first step seen
        # layer -> (step, norm, growth): grown under a clip since that step, not yet held
        self._grew: dict[int, tuple[int, float, float]] = {}
        self._total_grew: tuple[int, float] | None = None  # ... the total's (step, norm)
        # (step, each layer's median over the window then): the longer past's levels
        self._levels: deque[tuple[int, list[float | None]]] = deque()

    def _growth(self, window: deque[tuple[int, float]], value: float, first: int) -> float:
        while window and window[0][0] < first - self.t.exploding_window:
            window.popleft()
        if not self._has_baseline(first):
            return 1.0
        level = statistics.median([v for _, v in window]) if window else 0.0
        return value / level if level > 0 else 1.0

    def _held_under_clip(self, since: int, history: RecentPast, view: StepView) -> bool:
        """Has growth under a clip held from ``since`` for half a window of steps, with
        the smoothed training loss no lower than it was then?"""
        if view.step - since + 1 < max(2, self.t.exploding_window // 2):
            return False
        then = history.smoothed_loss(since, self.t.smoothing_steps)
        now = history.smoothed_loss(view.step, self.t.smoothing_steps)
        return then is None or now is None or now >= then

    def _has_baseline(self, first: int) -> bool:
        """Growth is judged against the run's own recent level once it has one: half a
        window of steps seen, a median of several (a run's first update moves it off
        its initialisation, whose norms are no level to grow from)."""
        return (
            self._first_step is not None
            and first - self._first_step >= self.t.exploding_window // 2
        )

    def _layer_growth(
        self, layer: int, value: float, first: int, history: RecentPast, now: int
    ) -> float:
        """``value`` over the layer's recent level: the median of its finite norms in the
        recent window (the norm shown for a record, or its peak when that is not
        finite); 1 while the run has no recent level yet. Or over its lowest level of
        the last ``exploding_long_window`` steps, while the loss has got no better
        since then (a steady climb, x1.5 a window, is an explosion too once it has
        grown that much; a norm that climbs while the loss improves is the loss's
        landscape sharpening, a Gaussian NLL's variance shrinking, not an unstable
        path)."""
        if not self._has_baseline(first):
            return 1.0
        norms = []
        for _, peaks, shown in self._recent:
            peak = peaks[layer] if layer < len(peaks) else None
            if peak is None or not math.isfinite(peak):
                continue
            norm = shown[layer] if layer < len(shown) else None
            norms.append(norm if norm is not None and math.isfinite(norm) else peak)
        level = statistics.median(norms) if norms else 0.0
        growth = value / level if level > 0 else 1.0
        lows = [
            old
            for _, levels in self._levels
            if layer < len(levels) and (old := levels[layer]) is not None and old > 0
        ]
        if not lows:
            return growth
        low = min(lows)
        since = self._levels[0][0]  # the longer past's start: one reference for every layer
        if value / low <= growth or not self._loss_no_better(history, since, now):
            return growth
        return value / low

    def _loss_no_better(self, history: RecentPast, since: int, now: int) -> bool:
        """The smoothed training loss at ``now`` no lower than over the steps after
        ``since`` (True when either is unknown: no evidence that it improves)."""
        smooth = self.t.smoothing_steps
        then_loss = history.smoothed_loss(min(now, since + smooth), smooth)
        now_loss = history.smoothed_loss(now, smooth)
        return then_loss is None or now_loss is None or now_loss >= then_loss

    def _note_levels(self, first: int) -> None:
        """Every ``exploding_window`` steps, each layer's recent level (its median over
        the window) joins the long past; levels older than ``exploding_long_window``
        steps leave it."""
        if self._levels and first - self._levels[-1][0] < self.t.exploding_window:
            return
        per_layer: list[list[float]] = []
        settled = (self._first_step or 0) + self.t.exploding_window // 2
        for step, peaks, shown in self._recent:
            if step < settled:
                continue  # (the run's first steps: its initialisation, no level)
            for i, peak in enumerate(peaks):
                norm = shown[i] if i < len(shown) else None
                value = norm if norm is not None and math.isfinite(norm) else peak
                if value is None or not math.isfinite(value):
                    continue
                while len(per_layer) <= i:
                    per_layer.append([])
                per_layer[i].append(value)
        if per_layer:
            levels = [statistics.median(v) if v else None for v in per_layer]
            self._levels.append((first, levels))
        while self._levels and self._levels[0][0] < first - self.t.exploding_long_window:
            self._levels.popleft()

    def _over(self, value: float, growth: float, bound: float) -> bool:
        return value > bound or (
            growth >= self.t.exploding_growth and value > self.t.exploding_growth_floor
        )

    def _bound(self, start: float | None) -> float:
        """The absolute bound; none at the run's own scale (a loss whose scale explains
        its norms, and that trains at it): there only growth against the run's recent
        level says explosion."""
        if self._own_scale is False or start is None or not math.isfinite(start):
            return self.t.exploding_norm
        return math.inf

    def _note_scale(self, history: RecentPast, view: StepView) -> None:
        """The run's first record sets its scale; judge, within the first steps, whether
        a run above the bound from the start trains at that scale."""
        if not self._seen:
            self._seen = True
            total = view.peak_total
            peaks = view.peak_grads
            above = (total is not None and total > self.t.exploding_norm) or any(
                g is not None and g > self.t.exploding_norm for g in peaks
            )
            loss = view.loss_estimate
            # the loss's scale explains them: no larger than the loss itself (a mean
            # loss of 2 with a gradient of 500 is not a summed loss's scale)
            explained = total is not None and loss is not None and 0 < total <= loss
            if above and explained:
                self._own_scale = None
                self._start_step = view.first
                self._start_over = [
                    i for i, g in enumerate(peaks) if g is not None and g > self.t.exploding_norm
                ]
                self._start = list(peaks)
                self._start_total = total
                self._start_loss = view.loss_estimate
                if view.loss_reduction == "sum":
                    # The probe read it off the loss's own node: a sum over elements,
                    # whose gradients are that large from the start. Its own scale.
                    self._own_scale = True
            return
        if self._own_scale is None and view.loss_reduction == "sum":
            self._own_scale = True
        if self._own_scale is not None:
            return
        began = self._start_loss
        now = history.smoothed_loss(view.step, self.t.smoothing_steps)
        if began is None or not began > 0:
            self._own_scale = False  # no loss to judge it by: the bound holds
        elif now is not None and now <= (1 - self.t.exploding_start_drop) * began:
            self._own_scale = True
        elif view.step >= self.t.exploding_start_steps:
            self._own_scale = False

    def _held_since_start(self) -> None:
        """The run was not at its own scale after all: the layers above the bound at its
        first record have been over it since then (named so, first failing first)."""
        for i in self._start_over:
            peak = self._start[i]
            if peak is not None:
                self._crossed[i] = (self._start_step, peak, 1.0)

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.grads_scaled is not None:
            return []  # norms times a GradScaler's scale: not this rule's to read
        if self._first_step is None:
            self._first_step = view.first
        undecided = self._own_scale is None
        self._note_scale(history, view)
        judged = undecided and self._own_scale is False  # held to the bound from now
        if judged:
            self._held_since_start()
        oldest = view.first - self.t.exploding_window
        while self._recent and self._recent[0][0] < oldest:
            self._recent.popleft()
        self._cross_layers(history, view)
        if judged:  # (even those back below the floor now: over it since the start)
            self._held_since_start()
            self._start_over = []
        if self._has_baseline(view.first):
            self._note_levels(view.first)
        self._recent.append((view.step, view.peak_grads, view.grad_norms))
        total = view.peak_total
        total_growth = 1.0
        if total is not None and math.isfinite(total):
            total_growth = self._growth(self._total, total, view.first)
            self._total.append((view.step, total))
        if self._crossed:
            return [self._layers_alert(history, view, total)]
        return self._total_alert(history, view, total, total_growth)

    def _cross_layers(self, history: RecentPast, view: StepView) -> None:
        """Each layer's crossing: over the bound, or grown past ``exploding_growth``
        (under a clip, growth that held), noted in ``_crossed`` with its first step."""
        start = self._start
        # Growth matters only above its floor (and the bound alone above that): most
        # norms are below both, and need no look at the window.
        floor = min(self.t.exploding_growth_floor, self.t.exploding_norm)
        peaks = view.peak_grads
        high = [
            i
            for i, peak in enumerate(peaks)
            if peak is not None and peak > floor and math.isfinite(peak)
        ]
        for i in list(self._crossed):  # back below the floor: no longer crossed
            peak = peaks[i] if i < len(peaks) else None
            if peak is not None and math.isfinite(peak) and peak <= floor:
                del self._crossed[i]
        # Growth under a clip must hold on every record since it began: a converged
        # model's rare large batches (a norm of 13 among norms of 0.01, then 0.2) are
        # each a new start, not one growth held across them.
        for i in [i for i in self._grew if i not in high]:
            del self._grew[i]
        for i in high:
            peak = peaks[i]
            assert peak is not None
            growth = self._layer_growth(i, peak, view.first, history, view.step)
            bound = self._bound(start[i] if i < len(start) else None)
            if not self._over(peak, growth, bound):
                self._crossed.pop(i, None)
                self._grew.pop(i, None)
            elif peak > bound or i in self._crossed or not view.clip_steps:
                self._crossed.setdefault(i, (view.step, peak, growth))
            else:
                # Under a clip, growth alone counts once it has gone on for half a
                # window, still growing, and the loss has not improved over it: the
                # clip bounds each step's update (a converged model's rare batches, a
                # gradient settling at a new level while the loss falls), and what it
                # hides is a *persistent* instability (the lesson), one the loss shows.
                since = self._grew.setdefault(i, (view.first, peak, growth))
                if peak >= since[1] and self._held_under_clip(since[0], history, view):
                    self._crossed[i] = self._grew.pop(i)

    def _layers_alert(self, history: RecentPast, view: StepView, total: float | None) -> Alert:
        """The alert for the crossed layers, named from the first that crossed."""
        order = first_failing({i: crossed[0] for i, crossed in self._crossed.items()})
        step, norm, growth = self._crossed[order[0]]
        names = [history.info.layer(i) for i in order]
        return self.alert(
            view.step,
            names[0],
            {
                "grad_norm": norm,
                "growth": growth,
                "since_step": step,
                "grad_norm_total": total if total is not None else math.nan,
                "layers_over": len(order),
                **_range(names, history.info.layers),
                **self._scale_evidence(),
            },
            layers=names,
        )

    def _total_alert(
        self, history: RecentPast, view: StepView, total: float | None, total_growth: float
    ) -> Findings:
        """The total norm crossed before any one layer did (it is the largest of them):
        the alert names the layer that carries it, as a faster run's peaks name it."""
        total_bound = self._bound(self._start_total)
        total_over = (
            total is not None
            and math.isfinite(total)
            and self._over(total, total_growth, total_bound)
        )
        if total_over and total is not None and total <= total_bound and view.clip_steps:
            # (growth alone under a clip: it must hold, as a layer's must)
            if self._total_grew is None:
                self._total_grew = (view.first, total)
            since_step, since_total = self._total_grew
            total_over = total >= since_total and self._held_under_clip(since_step, history, view)
        elif not total_over:
            self._total_grew = None
        if not total_over or total is None:
            return []
        carrier = _largest(view.peak_grads)
        subject = "total" if carrier is None else history.info.layer(carrier)
        return [
            self.alert(
                view.step,
                subject,
                {
                    "grad_norm_total": total,
                    "growth": total_growth,
                    "crossed": "the total norm",
                    **self._scale_evidence(),
                },
                layers=() if carrier is None else (subject,),
            )
        ]

    def _scale_evidence(self) -> dict[str, float]:
        """For a run above the bound from its first record: that record's total."""
        if self._start_total is None:
            return {}
        return {"first_grad_norm_total": self._start_total}


def _largest(norms: Sequence[float | None]) -> int | None:
    """The layer with the largest finite norm (None: none)."""
    best: int | None = None
    for i, norm in enumerate(norms):
        if norm is not None and math.isfinite(norm) and (best is None or norm > (norms[best] or 0)):
            best = i
    return best


def _range(names: Sequence[str], order: Sequence[str]) -> dict[str, str]:
    if len(names) < 2:
        return {}
    ordered = ordered_range(names, order)
    return {"range": f"{ordered[0]}..{ordered[-1]}"}
