"""The scenarios: each builds a model, an optimizer and data that show one failure mode.

Each builder's docstring says the bug, the evidence to look for on screen, and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from demo.catalog import SCENARIOS
from demo.data import Split, teacher_regression


@dataclass
class Setup:
    """What the trainer needs to run a scenario."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    train: Split
    val: Split
    steps: int
    batch_size: int = 64
    eval_every: int = 25
    watch_delay: float = 0.01  # seconds between steps when a person watches (traintop demo)


def mlp(dim: int, hidden: int, depth: int, activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """``depth`` hidden layers of width ``hidden``, then one output."""
    layers: list[nn.Module] = []
    width = dim
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), activation()]
        width = hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def healthy(fixed: bool = False) -> Setup:
    """A small MLP learns a smooth synthetic function with Adam at a sane learning rate.

    Evidence: train and validation loss fall together to the noise floor; gradient
    norms settle; no alert. This is the baseline every other scenario departs from.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    return Setup(model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(),
                 train, val, steps=1500)


def exploding(fixed: bool = False) -> Setup:
    """Plain SGD with a learning rate far too high (0.7 where 0.05 learns).

    Evidence: per-layer gradient norms climb step after step, past 100, until they
    and the loss are non-finite. Fix (``--fixed``): lr 0.05.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    lr = 0.05 if fixed else 0.7
    return Setup(model, torch.optim.SGD(model.parameters(), lr=lr), nn.MSELoss(),
                 train, val, steps=200, watch_delay=0.1)


BUILDERS: dict[str, Callable[[bool], Setup]] = {
    "healthy": healthy,
    "exploding": exploding,
}

assert set(BUILDERS) == set(SCENARIOS), "demo.catalog and demo.scenarios disagree"
