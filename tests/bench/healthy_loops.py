"""Healthy recipes (``tests/bench/healthy_recipes.py``) of other loop shapes: gradient
checkpointing, Adam written by hand (no optimizer), a ``torch.compile``d model."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.bench.healthy_models import batches, mlp, teacher_data
from tests.bench.healthy_recipes import Bench, Recipe, Trained


class Residual(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = (
            nn.LayerNorm(dim),
            nn.Linear(dim, 4 * dim),
            nn.Linear(4 * dim, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Checkpointed(nn.Module):
    """Residual blocks, each recomputed in the backward (non-reentrant checkpoint)."""

    def __init__(self, dim: int = 32, depth: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.stem, self.head = nn.Linear(20, dim), nn.Linear(dim, classes)
        self.blocks = nn.ModuleList([Residual(dim) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def checkpointing(bench: Bench, steps: int) -> None:
    """Gradient checkpointing (``use_reentrant=False``), AdamW 1e-3."""
    x, y = teacher_data(classes=4)
    model = Checkpointed()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(x, y, 64)
    with bench.watch(model, optimizer) as probe:
        for _ in range(steps):
            xb, yb = next(data)
            with probe.step():
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


def hand_adam(bench: Bench, steps: int) -> None:
    """Adam written by hand over the parameters (no torch.optim): ``watch(model)``."""
    x, y = teacher_data(classes=4)
    model = mlp([20, 64, 64, 4])
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    data = batches(x, y, 64)
    with bench.watch(model) as probe:
        for t in range(1, steps + 1):
            xb, yb = next(data)
            with probe.step():
                for p in params:
                    p.grad = None
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                with torch.no_grad():
                    for p, mp, vp in zip(params, m, v, strict=True):
                        assert p.grad is not None
                        mp.mul_(b1).add_(p.grad, alpha=1 - b1)
                        vp.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                        denom = (vp / (1 - b2**t)).sqrt_().add_(eps)
                        p.addcdiv_(mp, denom, value=-lr / (1 - b1**t))
                probe.log(loss=loss)


def compiled(bench: Bench, steps: int) -> Trained:
    """``torch.compile(model)`` (inductor), Adam 1e-3; the compiled module watched."""
    torch._dynamo.reset()
    x, y = teacher_data(classes=4)
    model = mlp([20, 64, 64, 4])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    fast = torch.compile(model)
    data = batches(x, y, 64)
    compile_s = 0.0
    with bench.watch(fast, optimizer) as probe:
        for i in range(steps):
            xb, yb = next(data)
            started = time.perf_counter()
            with probe.step():
                optimizer.zero_grad()
                loss = F.cross_entropy(fast(xb), yb)
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
            if i == 0:
                compile_s = time.perf_counter() - started
    return Trained(note=f"first step (the compile) {compile_s:.1f} s")


RECIPES = [
    Recipe("grad-checkpoint", "checkpointed blocks", "watch + step()", 1000, checkpointing),
    Recipe("hand-adam", "by hand, no optimizer", "watch(model) + step()", 1000, hand_adam),
    Recipe("torch-compile", "compiled model", "watch(compiled) + step()", 1000, compiled),
]  # fmt: skip
