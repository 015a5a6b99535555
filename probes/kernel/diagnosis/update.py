"""Rung 5, the update: are gradients cleared, does optimizer.step() run, does it change
the weights, and by how much; loss spikes (the update path turning unstable).

(The watch-time checks, parameters left out of the optimizer or an optimizer built for
another model, run in the training process: ``probes.runtime.live_checks.structure``.)
"""

from __future__ import annotations

import itertools
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
from probes.kernel.diagnosis.update_ratio import converged, family
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class GradNotCleared(Rule):
    """Gradients accumulate across updates because zero_grad was not called: the first
    backward pass after an update (``optimizer.step()``, a closure call, or the end of
    a step with no optimizer) found the gradient that update used, untouched, and added
    to it (``probes.runtime.optimizers.clearing``). Accumulating micro-batches between updates is
    not this: only a pass after an update is checked, whatever the loop's shape."""

    kind: str = AlertKind.GRAD_NOT_CLEARED
    replicated = True  # it reads what every replica holds alike
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


class UpdatesNotApplied(Rule):
    """A layer's gradient is non-zero, yet its weights did not change across
    optimizer.step(): the probe's version check (the optimizer never touched the
    tensor), an update ratio of exactly 0 on a sampled step, or a learning rate of 0.
    Updates by hand (no optimizer, no rate) that moved a layer on an earlier sample and
    move it no more are ``lr_too_low_to_update``'s: a rate decayed to nothing."""

    kind: str = AlertKind.UPDATES_NOT_APPLIED
    replicated = True  # it reads what every replica holds alike

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._streaks = Streaks()
        self._why: dict[int, str] = {}
        self._versions_trusted = True  # until a sampled step contradicts them
        self._moved: set[int] = set()  # layers a sampled ratio saw change
        self._state: object = None  # the names the optimizer keeps (what it is)

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if not view.optimizer_stepped or history.info.every > 1:
            return None
        if converged(history, view, self.t):
            # A finished fit: an optimizer whose own convergence test stops it (LBFGS's
            # tolerance on the gradient) leaves the weights as they are, by design.
            self._streaks = Streaks()
            return []
        if view.optimizer_state is not None:
            self._state = view.optimizer_state
        # A line search (LBFGS) takes no step when its own tests say so (the gradient or
        # the change below its tolerances): weights left as they were are its decision,
        # not an update lost. A rate of 0 still is.
        if family(history.info.optimizer, self._state) == "quasi_newton" and not (
            view.lrs and all(lr == 0 for lr in view.lrs)
        ):
            return []
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
        return [self._alert(history, view, reached)]

    def _alert(self, history: RecentPast, view: StepView, reached: dict[int, int]) -> Alert:
        """The alert for the layers whose streak reached its length (``reached``: each
        one's first step), named from the first that failed."""
        order = first_failing(reached)
        first = order[0]
        names = [history.info.layer(i) for i in order]
        step = reached_at(reached[first], self.t.not_applied_steps, view)
        assert step is not None
        return self.alert(
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
    replicated = True  # whether the replicas' optimizer stepped: alike on every rank

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

    def _spike(self, step: int, loss: float, values: list[float]) -> Alert | None:
        """``loss`` against the window's ``values`` (in step order): at least
        ``spike_factor`` times their median, and ``spike_deviations`` times their noise
        above it in log space. A loss's batch-to-batch noise is multiplicative (a
        converged loss near zero spans orders of magnitude from batch to batch; one at
        3 moves by a few percent), so the same rule sees 3 to 5 in an LLM run and
        passes a hard batch's 0.27 in a loss that already ranges from 0 to 0.1. The
        noise is read from consecutive steps' differences (the median one, scaled to a
        standard deviation), which a falling curve's trend does not inflate."""
        median = statistics.median(values)
        if not (median > 0 and loss > median * self.t.spike_factor):
            return None
        logs = [math.log(v) if v > 0 and math.isfinite(v) else None for v in values]
        steps = [abs(b - a) for a, b in itertools.pairwise(logs) if a is not None and b is not None]
        if 2 * len(steps) < len(values):
            return None  # mostly zeros: no scale to measure a jump against
        # |a - b| of two draws of N(0, s^2) has median 0.954 s
        noise = statistics.median(steps) / 0.954 or 0.01
        if math.log(loss) - math.log(median) <= self.t.spike_deviations * noise:
            return None
        # ... and it takes back a share of what the run has learnt (its first loss down
        # to the baseline): a converged loss's 2x blip (0.018 to 0.036 from 0.95) is
        # not an incident; a run that has made no progress is judged by the above alone
        progress = (self._start or 0.0) - median
        if progress > 0 and loss - median < self.t.spike_undone * progress:
            return None
        return self.alert(step, "loss", {"loss": loss, "baseline": median, "times": loss / median})

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
            found = self._spike(step, loss, [value for _, value in window])
        window.append((step, shown))
        if not math.isnan(shown):  # (a NaN is no bound: it never joins the least)
            while least and least[-1][1] >= shown:
                least.pop()
            least.append((step, shown))
        return found
