"""Rung 4, the gradient path, where a clip hides it: a clip active on nearly every step
(the instability it cuts off persists), and gradients clipped or read while a
GradScaler still holds them scaled (AMP without ``scaler.unscale_``)."""

from __future__ import annotations

from collections import deque

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class ClipAlwaysActive(Rule):
    """Over the last ``clip_window`` steps, the unclipped total norm above max_norm on
    at least ``clip_active_fraction`` of the steps that clipped (counted exactly
    however the records are thinned: the spec sums each record's steps)."""

    kind: str = AlertKind.CLIP_ALWAYS_ACTIVE

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._window: deque[tuple[int, int, int]] = deque()  # (step, clipped, active)
        self._clipped = 0
        self._active = 0
        self._first: int | None = None  # the first step of the run that clipped

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.clip_steps:
            if self._first is None:
                self._first = view.first
            self._window.append((view.step, view.clip_steps, view.clip_active_steps))
            self._clipped += view.clip_steps
            self._active += view.clip_active_steps
        window = self._window
        while window and window[0][0] <= view.step - self.t.clip_window:
            _, clipped, active = window.popleft()
            self._clipped -= clipped
            self._active -= active
        if self._first is None:
            return None  # the run does not clip: nothing to say
        if (
            view.step - self._first + 1 < self.t.clip_window
            or self._clipped < self.t.clip_min_steps
            or self._active < self.t.clip_active_fraction * self._clipped
        ):
            return []
        return [
            self.alert(
                view.step,
                "",
                {
                    "clip_active_steps": self._active,
                    "clipped_steps": self._clipped,
                    "fraction": self._active / self._clipped,
                    "window_steps": self.t.clip_window,
                },
            )
        ]


class GradsStillScaled(Rule):
    """The probe found the gradients still multiplied by a GradScaler's scale where it
    read them (a clip, or ``optimizer.step()`` itself): ``scaler.unscale_`` missing."""

    kind: str = AlertKind.GRADS_STILL_SCALED
    severity: Severity = Severity.ERROR

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        scale = view.grads_scaled
        if scale is None:
            return []
        total = view.grad_norm_total
        evidence = {"loss_scale": scale, "missing": "scaler.unscale_(optimizer)"}
        if total is not None:
            evidence.update(grad_norm_total=total, unscaled_total=total / scale)
        return [self.alert(view.step, "", evidence)]
