"""Rung 8, where the step's time goes: a loop that waits for its data (``input_bound``)
and a compiled model that compiles again and again (``recompiles``).

Step records carry the phases' seconds (``data_time``, ..., summed over a thinned record's
span) and ``cycle``, the whole step as the run pays for it, the wait included
(``probes.runtime.measure.phases``), and ``compiles``, the graphs torch.compile has made
so far. A record without them (an older probe) says nothing here.
"""

from __future__ import annotations

import math
from collections import deque

from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind

WARM_UP_STEPS = 10  # the first steps pay one-time costs (workers starting, allocation)


class InputBound(Rule):
    """The data wait's share of the steps' time over the last ``input_window_steps``
    steps, the records with the largest waits (``input_event_fraction`` of them) left
    out: a warning from ``input_warning_share``, an error from ``input_error_share``,
    the wait at least ``input_min_ms`` a step."""

    kind: str = AlertKind.INPUT_BOUND

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        # (first step, last step, data seconds, cycle seconds, samples)
        self._window: deque[tuple[int, int, float, float, int]] = deque()

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        data, cycle = view.data_time, view.cycle
        if data is None or cycle is None or not (math.isfinite(data) and math.isfinite(cycle)):
            return None
        if view.first < WARM_UP_STEPS or cycle <= 0:
            return []
        window = self._window
        window.append((view.first, view.step, max(data, 0.0), cycle, view.samples or 0))
        t = self.t
        while (
            len(window) > t.input_min_records and window[0][1] <= view.step - t.input_window_steps
        ):
            window.popleft()
        steps = view.step - window[0][0] + 1
        if steps < t.input_window_steps or len(window) < t.input_min_records:
            return []
        # the records whose wait a step is largest are events, not the input path
        kept = sorted(window, key=lambda w: w[2] / (w[1] - w[0] + 1))
        kept = kept[: len(kept) - int(len(kept) * t.input_event_fraction)]
        data_sum = math.fsum(w[2] for w in kept)
        cycle_sum = math.fsum(w[3] for w in kept)
        share = data_sum / cycle_sum if cycle_sum > 0 else 0.0
        kept_steps = sum(w[1] - w[0] + 1 for w in kept)
        if share < t.input_warning_share or 1000 * data_sum / kept_steps < t.input_min_ms:
            return []
        samples = sum(w[4] for w in kept)
        evidence: dict[str, object] = {
            "data_share": round(share, 3),
            "data_ms_per_step": round(1000 * data_sum / kept_steps, 2),
            "step_ms": round(1000 * cycle_sum / kept_steps, 2),
            "steps": steps,
        }
        if samples:
            evidence["samples_per_s"] = round(samples / cycle_sum, 1)
        severity = Severity.ERROR if share >= t.input_error_share else Severity.WARNING
        return [self.alert(view.step, "", evidence, severity=severity)]


class Recompiles(Rule):
    """At least ``recompile_new`` compilations within the last ``recompile_window_steps``
    steps, past the first ``recompile_warmup_steps``."""

    kind: str = AlertKind.RECOMPILES

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._seen: deque[tuple[int, int]] = deque()  # (step, compiles so far)

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        compiles = view.compiles
        if compiles is None:
            return None
        t = self.t
        if view.step < t.recompile_warmup_steps:
            return []
        seen = self._seen
        seen.append((view.step, compiles))
        while len(seen) > 1 and seen[1][0] <= view.step - t.recompile_window_steps:
            seen.popleft()
        new = compiles - seen[0][1]
        if new < t.recompile_new:
            return []
        steps = view.step - seen[0][0]
        return [self.alert(view.step, "", {"new": new, "compiles": compiles, "steps": steps})]
