"""AMP's GradScaler: a skipped update is not a non-finite run, a streak of them is news.

GradScaler unscales the gradients inside ``scaler.step(optimizer)`` and calls
``optimizer.step()`` only when they are finite; otherwise it skips the update and
lowers its loss scale. The probe marks a step whose ``optimizer.step()`` never ran
(``optimizer_step: false``); the diagnosis reads that as a skip, not as garbage.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from probes.kernel.diagnosis import Diagnoser
from tests.collector import Frame, FrameCollector, wait_for_bye, watch_unthinned


def train_with_scaler(
    model: nn.Module,
    collector: FrameCollector,
    steps: int,
    init_scale: float,
    *,
    target_scale: float = 1.0,
    nan_in_backward: bool = False,
) -> list[Frame]:
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x, y = torch.randn(32, 8), torch.randn(32, 1) * target_scale
    with watch_unthinned(model, optimizer, collector) as probe:
        for _ in range(steps):
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(x), y)
                if nan_in_backward:  # finite forward, NaN gradient (sqrt at zero, times 0)
                    weight = model[0].weight
                    loss = loss + 0.0 * torch.sqrt(weight.sum() - weight.sum())
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                probe.log(loss=loss)
    wait_for_bye(collector)
    return collector.kinds("step")


def diagnose(records: list[Frame]) -> Diagnoser:
    diagnoser = Diagnoser()
    for record in records:
        diagnoser.observe(record)
    return diagnoser


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def test_an_overflowing_first_step_is_skipped_quietly(collector: FrameCollector) -> None:
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    # 2**127 times gradients of ~10 overflows float32: the first update is skipped.
    records = train_with_scaler(model, collector, steps=8, init_scale=2.0**127, target_scale=10.0)
    first, rest = records[0], records[1:]
    assert first["optimizer_step"] is False
    assert not math.isfinite(first["grad_norm_total"])
    assert all("optimizer_step" not in r for r in rest), rest
    diagnoser = diagnose(records)
    assert diagnoser.raised_count == {}
    assert not all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_gradients_non_finite_at_any_scale_raise_skipped_updates(collector: FrameCollector) -> None:
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    records = train_with_scaler(
        model, collector, steps=12, init_scale=2.0**16, nan_in_backward=True
    )
    assert all(r["optimizer_step"] is False for r in records)
    diagnoser = diagnose(records)
    assert set(diagnoser.raised_count) == {"skipped_updates"}
    alert = diagnoser.active["skipped_updates"]  # as raised, at step 9
    assert (alert.evidence["skipped_steps"], alert.evidence["since_step"]) == (10, 0)
    # the scaler never let a non-finite update through
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def plain_loop(collector: FrameCollector, step_inside: bool, accumulate: int = 1) -> list[Frame]:
    """SGD steps with optimizer.step() inside or after the ``with probe.step()`` block;
    with ``accumulate``, it runs once every that many steps."""
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with watch_unthinned(model, optimizer, collector, grad_accumulation=accumulate > 1) as probe:
        for index in range(6):
            updates = (index + 1) % accumulate == 0
            with probe.step():
                nn.functional.mse_loss(model(x), y).backward()
                if step_inside and updates:
                    optimizer.step()
            if not step_inside and updates:
                optimizer.step()
            if updates:
                optimizer.zero_grad(set_to_none=True)
    wait_for_bye(collector)
    return collector.kinds("step")


@pytest.mark.parametrize("step_inside", [True, False])
def test_a_step_that_updates_is_never_marked_skipped(
    collector: FrameCollector, step_inside: bool
) -> None:
    records = plain_loop(collector, step_inside)
    assert [r["step"] for r in records] == list(range(6))
    assert all("optimizer_step" not in r for r in records), records


def test_accumulation_steps_without_an_update_are_marked(collector: FrameCollector) -> None:
    records = plain_loop(collector, step_inside=True, accumulate=3)
    assert [r.get("optimizer_step", True) for r in records] == [False, False, True] * 2
