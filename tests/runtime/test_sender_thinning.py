"""The sender's thinning of measurements (what a fast run sends)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from probes.kernel.thinning import Thinner
from probes.runtime.link.sender import PendingSteps


@dataclass
class FakeMeasurement:
    step: int
    sampled: bool = False
    bad: bool = False
    span: tuple[int, int] | None = None
    update_norms: list | None = None
    optimizer_step: bool | None = None
    grads: tuple[float, ...] = (1.0, 1.0)
    loss: float = 1.0
    duration: float = 0.01
    not_cleared: bool = False
    not_stepped: list[int] | None = None
    merged: dict | None = None

    def ready(self) -> bool:
        return True

    def has_non_finite(self) -> bool:
        return self.bad

    def merge_values(self) -> dict:
        grads = [math.nan, *self.grads[1:]] if self.bad else list(self.grads)
        return {
            "grad_norms": grads,
            "grad_norm_total": math.sqrt(sum(g * g for g in grads)),
            "scalars": {"loss": self.loss},
            "duration": self.duration,
            "optimizer_step": self.optimizer_step,
            "grads_not_cleared": self.not_cleared,
            "not_stepped": self.not_stepped,
        }

    def to_record(self) -> dict:
        return {"kind": "step", "step": self.step, **(self.merged or {})}


def merged(group: list) -> list:
    """What the sender's policy keeps of one group (nothing sent before it)."""
    return Thinner(PendingSteps()).merge(group)


def steps(count: int, *, sampled_every: int = 0, bad: tuple[int, ...] = ()) -> list:
    return [
        FakeMeasurement(i, sampled=bool(sampled_every) and i % sampled_every == 0, bad=i in bad)
        for i in range(count)
    ]


def test_a_group_keeps_its_last_step_so_the_step_count_stays_true() -> None:
    kept = merged(steps(10))
    assert [(m.step, m.span) for m in kept] == [(9, (0, 9))]


def test_a_group_keeps_its_last_sampled_step_too() -> None:
    kept = merged(steps(10, sampled_every=4))  # 0, 4, 8 sampled
    assert [(m.step, m.span) for m in kept] == [(8, (0, 8)), (9, None)]  # 9 stands alone


def test_a_merged_record_updated_if_any_of_its_steps_did() -> None:
    """Accumulation over 4 steps: the group's last step need not be one that updates."""
    group = steps(10, sampled_every=4)
    for m in group:
        m.optimizer_step = m.step % 4 == 1
    kept = merged(group)
    assert [(m.step, m.optimizer_step) for m in kept] == [(8, True), (9, True)]
    idle = steps(3)
    for m in idle:
        m.optimizer_step = False
    assert [m.optimizer_step for m in merged(idle)] == [False]


def test_a_non_finite_step_is_kept_with_the_one_before_it() -> None:
    kept = merged(steps(10, bad=(6, 7)))
    assert [(m.step, m.span) for m in kept] == [(5, (0, 5)), (6, (6, 9))]
    first_bad = merged(steps(4, bad=(0,)))
    assert [(m.step, m.span) for m in first_bad] == [(0, (0, 3))]


def test_thinning_a_fast_run_keeps_step_zero_every_bad_step_and_the_last() -> None:
    items = [*steps(1000, sampled_every=20, bad=(500,)), {"kind": "eval", "step": 999}]
    kept = Thinner(PendingSteps()).thin(items, 10)  # the first step sent alone
    measured = [m for m in kept if not isinstance(m, dict)]
    assert measured[0].step == 0 and measured[0].span is None
    assert 500 in [m.step for m in measured] and 499 in [m.step for m in measured]
    assert measured[-1].step == 999
    assert len(measured) <= 2 * 10 + 3  # about the budget: a group gives one or two
    assert kept[-1] == {"kind": "eval", "step": 999}  # other records pass, in order
    covered = sorted(
        step
        for m in measured
        for step in range(*((m.span[0], m.span[1] + 1) if m.span else (m.step, m.step + 1)))
    )
    assert covered == list(range(1000))  # every step is stood for, once
