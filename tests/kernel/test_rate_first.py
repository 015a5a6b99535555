"""A learning rate far too high is the root cause of what follows it: update ratios near
1 at step 0 are raised at once, and the explosion or divergence after them folds under
them; a low ratio explains no explosion, and an explosion first keeps its ratios."""

from __future__ import annotations

from typing import Any

from probes.kernel.diagnosis import Alert
from probes.kernel.diagnosis.incidents import cause_for, depth, waits_for_cause


def alert(kind: str, step: int, **evidence: Any) -> Alert:
    severity = "error" if kind != "update_ratio" or "far_too_high" in evidence else "warning"
    return Alert(kind, severity, step, "fc1", dict(evidence), "s", (), layers=("fc1",))


FAR_TOO_HIGH = {"side": "high", "far_too_high": ">=0.3_on_3_of_3_layers"}


def test_an_explosion_after_ratios_far_too_high_folds_under_them() -> None:
    ratios = alert("update_ratio", 0, **FAR_TOO_HIGH)
    explosion = alert("exploding_gradient", 1, since_step=1)
    diverged = alert("loss_diverged", 3, since_step=1)
    assert cause_for(explosion, {"update_ratio": ratios}) is ratios
    assert cause_for(diverged, {"update_ratio": ratios}) is ratios
    assert not waits_for_cause(ratios)  # raised at once: nothing comes before it


def test_near_misses_low_ratios_the_same_step_and_an_explosion_first() -> None:
    low = alert("update_ratio", 0, side="low")
    explosion = alert("exploding_gradient", 1, since_step=1)
    assert cause_for(explosion, {"update_ratio": low}) is None  # a low rate explodes nothing
    assert waits_for_cause(low)
    same_step = alert("exploding_gradient", 0)
    high = alert("update_ratio", 0, **FAR_TOO_HIGH)
    assert cause_for(same_step, {"update_ratio": high}) is None  # neither known first
    first = alert("exploding_gradient", 0)
    later_ratios = alert("update_ratio", 4, side="high")
    assert cause_for(later_ratios, {"exploding_gradient": first}) is first
    assert cause_for(first, {"update_ratio": later_ratios}) is None


def test_folds_in_time_both_ways_leave_the_settling_order_finite() -> None:
    assert depth("exploding_gradient") < depth("update_ratio")
    assert depth("loss_diverged") >= 1
