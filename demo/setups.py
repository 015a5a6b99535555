"""What a scenario hands the trainer (``Setup``: the model, its data and the loop's
options, bugs included), and the MLP most scenarios train."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from demo.data import Split


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
    guard: bool = False  # start with the guard on (non-finite gradients skip the update)
    target_shift: float = 0.0  # added to the targets (a scale the model must reach)
    target_scale: float = 1.0
    zero_grad: bool = True  # False: the no-zero-grad bug
    eval_mode: bool = True  # False: validation with model.train() left on
    eval_no_grad: bool = True  # False: validation with gradient recording on
    data_delay: float = 0.0  # seconds the loader takes for each batch (input-bound)
    keep_graph: bool = False  # True: the loss summed as a tensor (retained-graph)
    # Copies of the weights the loop keeps, one a step, for a later look: 0 none, None
    # every one, never evicted (memory-creep).
    snapshots: int | None = 0
    # Run before the first step (the data and batch checks), with the probe attached.
    before_training: Callable[[Setup, Any], None] | None = None

    def target(self, y: torch.Tensor) -> torch.Tensor:
        """The targets as this scenario trains on them."""
        if self.target_scale == 1.0 and self.target_shift == 0.0:
            return y
        return y * self.target_scale + self.target_shift


def mlp(dim: int, hidden: int, depth: int, activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """``depth`` hidden layers of width ``hidden``, then one output."""
    layers: list[nn.Module] = []
    width = dim
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), activation()]
        width = hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)
