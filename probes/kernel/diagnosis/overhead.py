"""Rung 7, the probe itself: does watching the run slow it down visibly?

Step records carry ``duration`` (the step's seconds) and ``probe_time`` (the probe's
own seconds: its code on the training thread, and its sender thread's CPU time on the
records), both summed over a thinned record's span. A record
without ``probe_time`` (an older probe) says nothing here.
"""

from __future__ import annotations

import math
from collections import deque

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind

WARM_UP_STEPS = 10  # the first steps pay one-time costs (imports, allocation): not counted
# The records a judgement reads at least, however many steps they stand for: the
# window's cheapest record is what tells the probe's cost from a busy machine's, and
# two or three records of a fast run (50 steps each) are each stretched alike.
MIN_RECORDS = 8


class ProbeOverhead(Rule):
    """The probe's share of the step time, over the last ``overhead_steps`` steps (and
    at least ``MIN_RECORDS`` records), above ``overhead_fraction`` (and at least
    ``overhead_min_ms`` a step); names the setting that would lower it.

    Both times are wall-clock: a machine busy with other work stretches some steps, the
    probe's part of them with the rest. The cost a step is therefore judged on the
    window's cheapest plain record and cheapest sampled one (a busy machine rarely
    stretches every step), amortised over ``sample_every``, not on the mean: a small
    model's probe on a crowded machine is not the probe's cost."""

    kind: str = AlertKind.PROBE_OVERHEAD
    severity: Severity = Severity.INFO

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        # (first step, last step, probe seconds, step seconds, sampled)
        self._window: deque[tuple[int, int, float, float, bool]] = deque()
        self._probe_sum = 0.0  # of the window, kept as it slides (read every record)
        self._step_sum = 0.0

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        probe, duration = view.probe_time, view.duration
        if (
            probe is None
            or duration is None
            or not (math.isfinite(probe) and math.isfinite(duration))
            or duration <= 0
        ):
            return None
        if view.first < WARM_UP_STEPS:
            return []
        window = self._window
        window.append((view.first, view.step, probe, duration, view.sampled))
        self._probe_sum += probe
        self._step_sum += duration
        while len(window) > MIN_RECORDS and window[0][1] <= view.step - self.t.overhead_steps:
            _, _, gone_probe, gone_step, _ = window.popleft()
            self._probe_sum -= gone_probe
            self._step_sum -= gone_step
        covered = view.step - window[0][0] + 1
        if (
            covered < self.t.overhead_steps
            or len(window) < MIN_RECORDS
            or self._step_sum <= 0
            or (self._probe_sum / self._step_sum <= self.t.overhead_fraction)
        ):
            return []
        probe_sum = math.fsum(w[2] for w in window)  # exact, now that it may be raised
        step_sum = math.fsum(w[3] for w in window)
        share = probe_sum / step_sum
        if (
            covered < self.t.overhead_steps
            or share <= self.t.overhead_fraction
            or 1000 * self._intrinsic_s(history) < self.t.overhead_min_ms
        ):
            return []
        return [
            self.alert(
                view.step,
                "",
                {
                    "probe_share": share,
                    "steps": covered,
                    "probe_ms_per_step": 1000 * probe_sum / covered,
                    "setting": self._setting(history, share),
                },
            )
        ]

    def _intrinsic_s(self, history: RecentPast) -> float:
        """The probe's seconds a step, from the cheapest plain and sampled records of the
        window (each per step), the sampled cost amortised over ``sample_every``."""
        plain = [w[2] / (w[1] - w[0] + 1) for w in self._window if not w[4]]
        sampled = [w[2] / (w[1] - w[0] + 1) for w in self._window if w[4]]
        every = history.info.sample_every
        plain_s = min(plain, default=0.0)
        if not sampled:
            return plain_s
        return plain_s * (1 - 1 / every) + min(sampled) / every

    def _setting(self, history: RecentPast, share: float) -> str:
        """The setting that would bring the share under the threshold: measure fewer
        steps (``every``) when plain steps cost too much, else sample less often."""
        plain = [w for w in self._window if not w[4]]
        plain_share = (
            math.fsum(w[2] for w in plain) / math.fsum(w[3] for w in plain)
            if plain and math.fsum(w[3] for w in plain) > 0
            else 0.0
        )
        target = self.t.overhead_fraction
        info = history.info
        if plain_share > target:
            return f"watch(every={info.every * math.ceil(plain_share / target)})"
        return f"watch(sample_every={info.sample_every * math.ceil(share / target)})"
