"""Rung 4, the gradient path, where a clip hides it: a clip active on nearly every step
(the instability it cuts off persists), and gradients clipped or read while a
GradScaler still holds them scaled (AMP without ``scaler.unscale_``)."""

from __future__ import annotations

import math
from collections import deque
from statistics import median

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class ClipAlwaysActive(Rule):
    """A clip that hides a persistent instability (the lesson: "log the unclipped norm
    and investigate ... rather than hiding persistent instability"): over the last
    ``clip_window`` steps, the unclipped total norm above max_norm on at least
    ``clip_active_fraction`` of the steps that clipped (counted exactly however the
    records are thinned), *and* the instability shows under it: the unclipped norm
    keeps rising (its median over the window's last quarter ``clip_norm_growth``
    times its first quarter's; in the run's first window, where a gradient scale grows
    as the model leaves its initialisation, only with the loss no better) or the loss
    got worse while clipped (its last quarter's median above its first quarter's by
    more than ``clip_loss_spread`` times the first quarter's own spread). A clip active
    on every step of a run whose norm holds and whose loss falls or rests at its floor
    (a GPT at clip 1.0, a regression at its noise floor) is a bound below the run's
    gradient scale doing its job."""

    kind: str = AlertKind.CLIP_ALWAYS_ACTIVE
    replicated = True  # it reads what every replica holds alike

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        # (step, clipped, active, unclipped total norm, loss) of the records that clipped
        self._window: deque[tuple[int, int, int, float | None, float | None]] = deque()
        self._clipped = 0
        self._active = 0
        self._first: int | None = None  # the first step of the run that clipped

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        if view.clip_steps:
            if self._first is None:
                self._first = view.first
            norm = view.grad_norm_total
            loss = view.loss_estimate
            self._window.append(
                (
                    view.step,
                    view.clip_steps,
                    view.clip_active_steps,
                    norm if norm is not None and math.isfinite(norm) else None,
                    loss if loss is not None and math.isfinite(loss) else None,
                )
            )
            self._clipped += view.clip_steps
            self._active += view.clip_active_steps
        window = self._window
        while window and window[0][0] <= view.step - self.t.clip_window:
            _, clipped, active, _, _ = window.popleft()
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
        shows = self._instability(view.step)
        if shows is None:
            return []
        evidence: dict[str, float | int | str] = {
            "clip_active_steps": self._active,
            "clipped_steps": self._clipped,
            "fraction": self._active / self._clipped,
            "window_steps": self.t.clip_window,
        }
        evidence.update(shows)
        return [self.alert(view.step, "", evidence)]

    def _instability(self, now: int) -> dict[str, float | str] | None:
        """What shows the instability under the clip in the window (None: nothing):
        the unclipped norm rising, or the loss rising beyond its own noise."""
        quarter = self.t.clip_window / 4
        early = [r for r in self._window if r[0] <= now - 3 * quarter]
        late = [r for r in self._window if r[0] > now - quarter]
        early_norms = [r[3] for r in early if r[3] is not None]
        late_norms = [r[3] for r in late if r[3] is not None]
        early_losses = [r[4] for r in early if r[4] is not None]
        late_losses = [r[4] for r in late if r[4] is not None]
        if early_norms and late_norms:
            before, after = median(early_norms), median(late_norms)
            if (
                before > 0
                and after >= self.t.clip_norm_growth * before
                and (self._settled(now) or _no_better(early_losses, late_losses))
            ):
                return {"unclipped_norm_from": before, "unclipped_norm_to": after}
        if len(early_losses) >= 3 and late_losses:
            before, after = median(early_losses), median(late_losses)
            spread = median([abs(v - before) for v in early_losses])
            if after > before + self.t.clip_loss_spread * spread and after > before:
                return {"loss_from": before, "loss_to": after, "loss_spread": spread}
        return None

    def _settled(self, now: int) -> bool:
        """Is the window past the run's first ``clip_window`` clipped steps? Those are
        its move off the initialisation: a gradient scale that grows while the loss
        falls fastest (a GPT's norm x5 in its first 150 steps as its loss falls x4) is
        learning, no level to grow from, as the explosion rule's baseline waits out
        the first steps. There the norm's growth counts only with the loss no better."""
        assert self._first is not None
        return now - self.t.clip_window + 1 >= self._first + self.t.clip_window


def _no_better(early: list[float], late: list[float]) -> bool:
    """The late quarter's median loss no lower than the early quarter's (True when
    either is unknown: no evidence that it improves)."""
    return not early or not late or median(late) >= median(early)


class GradsStillScaled(Rule):
    """The probe found the gradients still multiplied by a GradScaler's scale where it
    read them (a clip, or ``optimizer.step()`` itself): ``scaler.unscale_`` missing."""

    kind: str = AlertKind.GRADS_STILL_SCALED
    replicated = True  # it reads what every replica holds alike
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
