"""A learning rate far too high, on every loop shape that has an optimizer (issue 18,
items 1 and 2): one backward per update, gradient accumulation, a closure (LBFGS) and
AMP with GradScaler. Each raises an error within two steps, and the update ratios near
1 of step 0 are part of its incident; each healthy twin raises nothing.

Tiny in-process runs (a 3-layer MLP, 12 steps), every step its own record."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tests.collector import Frame, FrameCollector, diagnose, wait_for_bye, watch_unthinned

SHAPES = {  # shape -> (far too high, healthy)
    "plain": (20.0, 0.05),
    "accumulation": (20.0, 0.05),
    "closure": (50.0, 1.0),
    "amp": (20.0, 0.05),
}


@pytest.fixture
def fresh_collector() -> Iterator[FrameCollector]:
    folder = tempfile.mkdtemp(prefix="tt-")
    collector = FrameCollector(os.path.join(folder, "m.sock"))
    yield collector
    collector.close()
    shutil.rmtree(folder, ignore_errors=True)


def train(shape: str, lr: float, collector: FrameCollector, steps: int = 12) -> list[Frame]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)
    )
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    optimizer: torch.optim.Optimizer
    if shape == "closure":
        optimizer = torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=4)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu")
    with watch_unthinned(model, optimizer, collector) as probe:
        for _ in range(steps):
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                if shape == "plain":
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                elif shape == "accumulation":  # 4 micro-batches, the loss divided
                    loss = torch.zeros(())
                    for xb, yb in zip(x.chunk(4), y.chunk(4), strict=True):
                        micro = nn.functional.mse_loss(model(xb), yb) / 4
                        micro.backward()
                        loss = loss + micro.detach()
                    optimizer.step()
                elif shape == "closure":

                    def closure() -> torch.Tensor:
                        optimizer.zero_grad()
                        value = nn.functional.mse_loss(model(x), y)
                        value.backward()
                        return value

                    loss = optimizer.step(closure)  # type: ignore[assignment]
                else:  # AMP, done right: unscale_ before the clip
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = nn.functional.mse_loss(model(x).float(), y)
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)
                    scaler.step(optimizer)
                    scaler.update()
                probe.log(loss=loss)
    wait_for_bye(collector)
    return list(collector.frames)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_lr_far_too_high_is_an_error_within_two_steps(
    shape: str, fresh_collector: FrameCollector
) -> None:
    frames = train(shape, SHAPES[shape][0], fresh_collector)
    first_sample = next(f for f in frames if f["kind"] == "step")
    assert min(first_sample["update_ratios"]) > 0.8  # updates as large as the weights
    alerts, diagnoser = diagnose(frames)
    assert alerts, shape
    first = alerts[0]
    assert first.severity == "error" and first.step <= 2, first.line()
    assert first.kind in {"update_ratio", "exploding_gradient"}, first.line()
    # step 0's ratios are in the incident: raised, or folded under what came with them
    incident = diagnoser.incidents[first.key]
    assert first.kind == "update_ratio" or "update_ratio@0" in incident.folded, incident.line()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_near_miss_the_healthy_rate_raises_nothing(
    shape: str, fresh_collector: FrameCollector
) -> None:
    frames = train(shape, SHAPES[shape][1], fresh_collector)
    alerts, _ = diagnose(frames)
    assert alerts == [], [a.line() for a in alerts]
