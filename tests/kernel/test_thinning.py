"""The thinning policy (``probes.kernel.thinning``, ``probes.kernel.merge``): the peaks a
merged record keeps, where a group is cut, and the point of it all: thinned and
unthinned copies of the same records raise the same alerts at the same steps."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from probes.kernel.diagnosis import Diagnoser, RunInfo
from probes.kernel.merge import Peaks
from probes.kernel.thinning import RECORDS, Member, plan
from tests.frames import thinned_as_sent

Record = dict[str, Any]
LAYERS = ("enc.0", "enc.1", "head")
INFO = RunInfo(
    layers=LAYERS,
    params=tuple(f"{name}.weight" for name in LAYERS),
    activations=(("act", "relu"),),
    activation_layers=(0,),
    update_check=True,
)


def step(
    n: int, loss: float = 1.0, grads: tuple[float | None, ...] = (1.0, 1.0, 1.0), **fields: Any
) -> Record:
    record: Record = {
        "kind": "step",
        "step": n,
        "scalars": {"loss": loss},
        "grad_norms": list(grads),
        "grad_norm_total": math.sqrt(sum((g or 0.0) ** 2 for g in grads)),
        "duration": 0.01,
        "lr": [1e-3],
    }
    record.update(fields)
    return record


# --- a merged record -------------------------------------------------------------------


def test_a_merged_record_keeps_the_peaks_of_its_span() -> None:
    records = [
        step(4, loss=2.0, grads=(1.0, 9.0, 1.0), probe_time=0.001),
        step(5, loss=0.5, grads=(3.0, 1.0, 1.0), probe_time=0.002),
        step(6, loss=1.0, grads=(1.0, 1.0, 2.0), probe_time=0.001),
    ]
    merged = RECORDS.collapse(records)
    assert merged["step"] == 6 and merged["span"] == [4, 6]
    assert merged["grad_norms"] == [1.0, 1.0, 2.0]  # the step it shows
    assert merged["grad_norms_max"] == [3.0, 9.0, 2.0]
    assert merged["grad_norm_total_max"] == pytest.approx(math.sqrt(83))
    assert (merged["scalars_max"], merged["scalars_min"]) == ({"loss": 2.0}, {"loss": 0.5})
    assert merged["duration"] == pytest.approx(0.03)
    assert merged["probe_time"] == pytest.approx(0.004)
    assert "first_non_finite_step" not in merged
    assert "probe_time" not in RECORDS.collapse([step(1), step(2)])  # never invented


def test_the_first_non_finite_step_is_named_and_shown_and_peaks_stay_finite() -> None:
    records = [
        step(0, grads=(1.0, 50.0, 1.0)),
        step(1, loss=math.nan),
        step(2, grads=(1.0, math.inf, 1.0)),
        step(3),
    ]
    merged = RECORDS.collapse(records)
    assert merged["step"] == 1 and math.isnan(merged["scalars"]["loss"])
    assert merged["first_non_finite_step"] == 1
    assert merged["grad_norms_max"] == [1.0, 50.0, 1.0]
    assert merged["scalars_max"] == {"loss": 1.0}


def test_flags_of_a_merged_record() -> None:
    """It updated if any step did; it held old gradients if every updating step did; it
    names the layers no update of its span touched."""
    accumulating = [step(0, optimizer_step=False), step(1), step(2, optimizer_step=False)]
    assert "optimizer_step" not in RECORDS.collapse(accumulating)
    idle = [step(0, optimizer_step=False), step(1, optimizer_step=False)]
    assert RECORDS.collapse(idle)["optimizer_step"] is False
    streak = [step(n, grads_not_cleared=True, not_stepped=[1, 2]) for n in range(3)]
    merged = RECORDS.collapse(streak)
    assert merged["grads_not_cleared"] is True and merged["not_stepped"] == [1, 2]
    broken = [*streak, step(3, not_stepped=[2])]
    merged = RECORDS.collapse(broken)
    assert "grads_not_cleared" not in merged and merged["not_stepped"] == [2]


def test_peaks_of_merged_records_merge_again() -> None:
    first = RECORDS.collapse([step(0, loss=3.0), step(1, grads=(7.0, 1.0, 1.0))])
    second = RECORDS.collapse([step(2, loss=0.2), step(3)])
    merged = RECORDS.collapse([first, second])
    assert merged["span"] == [0, 3]
    assert merged["grad_norms_max"][0] == 7.0
    assert (merged["scalars_max"]["loss"], merged["scalars_min"]["loss"]) == (3.0, 0.2)
    assert merged["duration"] == pytest.approx(0.04)


def test_peaks_accumulate_scalars_other_than_the_loss() -> None:
    peaks = Peaks()
    for n, acc in enumerate((0.5, 0.9, 0.7)):
        peaks.add(
            {
                "grad_norms": [1.0],
                "grad_norm_total": 1.0,
                "scalars": {"loss": 1.0, "acc": acc},
                "duration": None,
                "probe_time": None,
                "optimizer_step": None,
                "grads_not_cleared": False,
                "not_stepped": None,
            },
            step=n,
            non_finite=False,
        )
    fields = peaks.fields()
    assert fields["scalars_max"]["acc"] == 0.9 and fields["scalars_min"]["acc"] == 0.5


# --- where a group is cut ----------------------------------------------------------------


def member(
    total: float = 1.0,
    loss: float = 1.0,
    *,
    keep: bool = False,
    bad: bool = False,
    grads: tuple[float, ...] = (),
    skipped: bool = False,
) -> Member:
    return Member.of(
        non_finite=bad,
        keep=keep,
        total=total,
        scalars={"loss": loss},
        grads=grads,
        skipped=skipped,
    )


def test_a_group_ends_at_its_last_sampled_step_and_its_last() -> None:
    group = [member(keep=i in (2, 6)) for i in range(10)]
    assert plan(group) == [(0, 6, 6), (7, 9, 9)]


def test_an_escalation_is_sent_at_its_own_step() -> None:
    """An explosion doubles step after step: each doubling ends a sub-span, so the step
    a rule crosses its bound is a record's own step."""
    totals = [1.0, 1.1, 0.9, 5.0, 30.0, 200.0, 210.0, 190.0]
    assert plan([member(t) for t in totals]) == [
        (0, 2, 2),
        (3, 3, 3),
        (4, 4, 4),
        (5, 5, 5),
        (6, 7, 7),
    ]
    # judged against the group before too: no cut where the previous group was as high
    assert plan([member(t) for t in totals[3:]], reference=(1.0, 300.0)) == [(0, 4, 4)]
    # one layer's norm doubling counts, whatever the total does
    layer = [member(10.0, grads=(g, 10.0)) for g in (0.1, 0.1, 0.2, 0.3, 0.5)]
    assert plan(layer) == [(0, 1, 1), (2, 2, 2), (3, 4, 4)]
    # a loss spike likewise
    assert plan([member(loss=x) for x in (1.0, 1.2, 9.0, 1.1)]) == [(0, 1, 1), (2, 2, 2), (3, 3, 3)]


def test_a_non_finite_step_shows_the_rest_of_its_group() -> None:
    group = [member(), member(), member(keep=True), member(bad=True), member(), member()]
    assert plan(group) == [(0, 2, 2), (3, 5, 3)]
    # the finite part is cut as any group is (here at an escalation)
    group = [member(), member(), member(40.0), member(), member(bad=True)]
    assert plan(group) == [(0, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4)]


def test_after_a_non_finite_step_skipped_updates_and_applied_ones_are_not_merged() -> None:
    """AMP's GradScaler skips a step whose gradients overflowed (by design, while it
    finds its scale): merged with the applied steps after it, that step would read as a
    non-finite update that ran. Each run of skipped or applied steps is its own span,
    shown by its first non-finite step, else its last."""
    skip = member(bad=True, skipped=True)
    group = [member(), skip, member(), member(), skip, skip, member(), member()]
    assert plan(group) == [(0, 0, 0), (1, 1, 1), (2, 3, 3), (4, 5, 4), (6, 7, 7)]
    # an accumulation loop's micro-steps skip by design: past 8 runs, the rest is one
    alternating = [member(bad=True, skipped=i % 2 == 0) for i in range(40)]
    spans = plan(alternating)
    assert len(spans) == 9 and spans[-1] == (8, 39, 8)
    # every step skipped, or none: one span, as before
    assert plan([skip] * 5) == [(0, 4, 0)]


def amp_healthy() -> list[Record]:
    """A healthy run under GradScaler: the scale found at the start (steps 0, 1 and 5
    overflow and are skipped), one overflow later (step 130)."""
    records = healthy()
    for n in (0, 1, 5, 130):
        records[n].update(
            grad_norms=[math.inf, 0.3, 0.2], grad_norm_total=math.inf, optimizer_step=False
        )
    return records


# --- the same alerts at the same steps, whatever the speed ---------------------------------


def exploding() -> list[Record]:
    rng = random.Random(1)
    records = []
    for n in range(80):
        g = 1.0 + 0.1 * rng.random() if n < 40 else 1.6 ** (n - 40)
        grads = (g, 1.5 * g, 0.5) if n < 70 else (math.inf, math.inf, 0.5)
        loss = 1.0 if n < 70 else math.nan
        records.append(step(n, loss=loss, grads=grads))
    return records


def vanishing() -> list[Record]:
    return [
        step(n, grads=(1e-9, 1e-7, 1.0), param_norms=[1.0] * 3 if n % 20 == 0 else None)
        for n in range(120)
    ]


def not_cleared() -> list[Record]:
    return [step(n, grads=(1.0 + n, 1.0 + n, 1.0), grads_not_cleared=n > 0) for n in range(60)]


def spike() -> list[Record]:
    rng = random.Random(2)
    return [step(n, loss=(12.0 if n == 130 else 1.0 + 0.05 * rng.random())) for n in range(200)]


def lr_zero() -> list[Record]:
    return [step(n, lr=[0.0]) for n in range(60)]


def left_out() -> list[Record]:
    return [step(n, not_stepped=[2]) for n in range(60)]


def none_grads() -> list[Record]:
    return [step(n, grads=(1.0, 1.0, None), none_grad_params=[2]) for n in range(60)]


def flat() -> list[Record]:
    rng = random.Random(3)
    return [step(n, loss=1.0 + 0.05 * rng.random()) for n in range(300)]


def dead() -> list[Record]:
    return [
        step(n, **({"activations": [1.0], "param_norms": [1.0] * 3} if n % 20 == 0 else {}))
        for n in range(100)
    ]


def healthy() -> list[Record]:
    rng = random.Random(4)
    records = []
    for n in range(400):
        record = step(
            n,
            loss=0.1 + math.exp(-n / 100) * (1 + 0.05 * rng.random()),
            grads=(0.5 + 0.1 * rng.random(), 0.3, 0.2),
        )
        if n % 20 == 0:
            record.update(param_norms=[5.0] * 3, update_ratios=[1e-3] * 3, activations=[0.5])
        records.append(record)
    return records


def raised(records: list[Record]) -> list[tuple[str, str, int]]:
    diagnoser = Diagnoser(INFO)
    changes = [c for r in records for c in diagnoser.observe(r)] + diagnoser.finish()
    return [(c.alert.kind, c.alert.subject, c.alert.step) for c in changes if c.raised]


SCENARIOS: dict[str, tuple[Callable[[], list[Record]], str]] = {
    "exploding": (exploding, "exploding_gradient"),
    "vanishing": (vanishing, "vanishing_gradient"),
    "not_cleared": (not_cleared, "grad_not_cleared"),
    "spike": (spike, "loss_spike"),
    "lr_zero": (lr_zero, "updates_not_applied"),
    "left_out": (left_out, "updates_not_applied"),
    "none_grads": (none_grads, "none_gradients"),
    "flat": (flat, "flat_loss"),
    "dead": (dead, "dead_activations"),
    "healthy": (healthy, ""),
    "amp_healthy": (amp_healthy, ""),
}


@pytest.mark.parametrize("factor", [7, 50])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_thinned_and_unthinned_records_raise_the_same_alerts_at_the_same_steps(
    name: str, factor: int
) -> None:
    """The same run at 60 steps/s and at 420 or 3,000 (the sender's budget is 60
    records a second): the same alerts, naming the same layer, within 2 steps (a climb
    slower than the escalation factor per step crosses its bound inside a span)."""
    build, kind = SCENARIOS[name]
    records = build()
    every = raised(records)
    thinned_records = thinned_as_sent(records, factor)
    assert sum(r["kind"] == "step" for r in thinned_records) < len(records) / factor * 4
    thinned = raised(thinned_records)
    assert [(k, s) for k, s, _ in thinned] == [(k, s) for k, s, _ in every]
    for (_, _, fast), (_, _, slow) in zip(thinned, every, strict=True):
        assert 0 <= fast - slow <= 2, (thinned, every)
    assert [k for k, _, _ in every][:1] == ([kind] if kind else [])


def test_an_explosion_doubling_each_step_is_raised_at_the_same_step() -> None:
    records = [step(n, grads=(2.0 ** max(0, n - 30), 1.0, 1.0)) for n in range(60)]
    every = raised(records)
    assert every[0][:2] == ("exploding_gradient", "enc.0")
    assert raised(thinned_as_sent(records, 50)) == every


def test_every_anchor_is_shown_on_its_own_whatever_the_group() -> None:
    """A job's ranks thin at their own pace; their anchor steps (the same on every rank)
    are always cut points, so the cross-rank checks have steps to compare."""
    members = [
        Member.of(
            non_finite=False,
            keep=i % 20 == 0,
            total=1.0,
            scalars={"loss": 1.0},
            anchor=i % 100 == 0,
        )
        for i in range(300)
    ]
    representatives = [rep for _, _, rep in plan(members)]
    assert {0, 100, 200} <= set(representatives)
    assert 299 in representatives
    unanchored = [
        Member.of(non_finite=False, keep=i % 20 == 0, total=1.0, scalars={"loss": 1.0})
        for i in range(300)
    ]
    assert 100 not in [rep for _, _, rep in plan(unanchored)]  # only the last sampled
