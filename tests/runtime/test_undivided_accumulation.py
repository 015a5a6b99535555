"""Gradient accumulation whose micro-batch losses were never divided (issue 29): named
from the passes themselves (``probes.runtime.measure.undivided``), with no validation loss to
compare against, and only that: a GAN's two losses summed by two calls, a divided loss,
an LBFGS closure, a GradScaler's scaled loss and a summed reduction are not it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probes.runtime.patches.patches import REGISTRY
from tests.collector import FrameCollector, diagnose, verdicts, wait_for_bye, watch_unthinned

Frame = dict[str, Any]


def data(n: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=generator)
    return x, (x @ torch.randn(16, 4, generator=generator)).argmax(1)


def run_loop(
    collector: FrameCollector, micro_step: Callable[..., None], steps: int = 12
) -> list[Frame]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = data()
    with watch_unthinned(model, optimizer, collector) as probe:
        for i in range(steps):
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                micro_step(model, optimizer, x, y, i)
                optimizer.step()
    wait_for_bye(collector)
    return [f for f in collector.frames if f["kind"] in ("hello", "step", "eval")]


def kinds(frames: list[Frame]) -> list[str]:
    alerts, _ = diagnose(frames)
    return [a.kind for a in verdicts(alerts)]


def batches(
    x: torch.Tensor, y: torch.Tensor, i: int, k: int = 4
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (x[(i * k + j) * 16 % 4096 :][:16], y[(i * k + j) * 16 % 4096 :][:16]) for j in range(k)
    ]


def undivided(model: nn.Module, _: Any, x: torch.Tensor, y: torch.Tensor, i: int) -> None:
    for xb, yb in batches(x, y, i):
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()


def undivided_module(model: nn.Module, _: Any, x: torch.Tensor, y: torch.Tensor, i: int) -> None:
    criterion = nn.CrossEntropyLoss()
    for xb, yb in batches(x, y, i):
        criterion(model(xb), yb).backward()


def divided(model: nn.Module, _: Any, x: torch.Tensor, y: torch.Tensor, i: int) -> None:
    for xb, yb in batches(x, y, i):
        (F.cross_entropy(model(xb), yb) / 4).backward()


def summed(model: nn.Module, _: Any, x: torch.Tensor, y: torch.Tensor, i: int) -> None:
    """A summed reduction over the update's examples: a choice, not a mean left undivided."""
    for xb, yb in batches(x, y, i):
        F.cross_entropy(model(xb), yb, reduction="sum").backward()


def two_losses(model: nn.Module, _: Any, x: torch.Tensor, y: torch.Tensor, i: int) -> None:
    """DCGAN's discriminator: a loss on the real batch and one on the fake, one
    ``backward()`` each, on two lines: the sum of two different losses."""
    (real_x, real_y), (fake_x, fake_y) = batches(x, y, i, 2)
    real = F.cross_entropy(model(real_x), real_y)
    real.backward()
    fake = F.cross_entropy(model(fake_x), fake_y)
    fake.backward()


def with_scaler(model: nn.Module, _: Any, x: torch.Tensor, y: torch.Tensor, i: int) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0, enabled=True)
    for xb, yb in batches(x, y, i):
        scaler.scale(F.cross_entropy(model(xb), yb) / 4).backward()


@pytest.mark.parametrize("loop", [undivided, undivided_module], ids=["function", "module"])
def test_an_undivided_accumulation_is_named_without_a_validation(
    collector: FrameCollector, loop: Callable[..., None]
) -> None:
    frames = run_loop(collector, loop)
    alerts, _ = diagnose(frames)
    first = alerts[0]
    assert (first.kind, first.subject, first.step) == ("loss_reduction_mismatch", "loss", 2)
    assert first.evidence["backward_passes"] == 4
    assert kinds(frames) == ["loss_reduction_mismatch"]


@pytest.mark.parametrize(
    "loop", [divided, summed, two_losses, with_scaler], ids=["divided", "summed", "gan", "scaler"]
)
def test_near_miss_other_ways_of_adding_passes(
    collector: FrameCollector, loop: Callable[..., None]
) -> None:
    frames = run_loop(collector, loop)
    steps = [f for f in frames if f["kind"] == "step"]
    assert max(max(f.get("backward_passes") or [0]) for f in steps) >= 2  # passes added up
    assert not any(f.get("undivided_passes") for f in steps)
    assert kinds(frames) == []


def test_near_miss_an_lbfgs_closure_clears_before_each_pass(collector: FrameCollector) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = data(256)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with watch_unthinned(model, optimizer, collector) as probe:
        for _ in range(10):
            with probe.step():
                optimizer.step(closure)
    wait_for_bye(collector)
    steps = [f for f in collector.frames if f["kind"] == "step"]
    assert steps and not any(f.get("undivided_passes") for f in steps)


def test_its_layers_leave_with_the_probe(collector: FrameCollector) -> None:
    run_loop(collector, undivided, steps=2)
    assert not [layer for layer in REGISTRY.patched() if "undivided" in str(layer)]
