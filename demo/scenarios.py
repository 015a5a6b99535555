"""The scenarios: each builds a model, an optimizer and data that show one failure mode.

Each builder's docstring says the bug, the evidence to look for on screen, and the fix.
"""

from __future__ import annotations

from collections import OrderedDict
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
    guard: bool = False  # start with the guard on (non-finite gradients skip the update)
    target_shift: float = 0.0  # added to the targets (a scale the model must reach)
    target_scale: float = 1.0

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


class LogComplement(nn.Module):
    """-log(1 - p): softplus written the textbook way. In float32, p = sigmoid(z)
    rounds to exactly 1 once z passes about 17, and log(0) = -inf."""

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        return -torch.log(1 - p)


def nan_forward(fixed: bool = False) -> Setup:
    """The model predicts softplus(z) as -log(1 - sigmoid(z)); the targets (16 to 20)
    push the score z up until sigmoid(z) rounds to 1 and the log is of 0.

    Evidence: after about 50 steps the loss turns inf and the guard (on in this demo)
    skips the update and pauses. Press a: the anomaly step's report names
    ``log_complement`` as the first module whose output is non-finite while its input
    was finite (anomaly mode alone blames a backward op, SigmoidBackward0). Fix
    (``--fixed``): ``nn.Softplus()``, which is computed stably.
    """
    train, val = teacher_regression(2048, 512)
    head: list[tuple[str, nn.Module]] = [("softplus", nn.Softplus())] if fixed else [
        ("prob", nn.Sigmoid()), ("log_complement", LogComplement())]
    model = nn.Sequential(OrderedDict([
        ("encoder", nn.Linear(16, 32)), ("act", nn.Tanh()), ("score", nn.Linear(32, 1)),
        *head]))
    return Setup(model, torch.optim.Adam(model.parameters(), lr=1e-2), nn.MSELoss(),
                 train, val, steps=400, watch_delay=0.05, guard=True,
                 target_scale=2.0, target_shift=18.0)


class Magnitude(nn.Module):
    """||h|| written by hand. Its forward at h = 0 is a fine 0, but the gradient of
    sqrt at 0 is inf, and inf times the 0 from d(h**2)/dh is NaN."""

    def __init__(self, stable: bool = False) -> None:
        super().__init__()
        self.stable = stable

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.stable:
            return torch.linalg.vector_norm(h, dim=1, keepdim=True)  # gradient 0 at 0
        return torch.sqrt((h ** 2).sum(dim=1, keepdim=True))


def nan_backward(fixed: bool = False) -> Setup:
    """A feature is the norm of a bias-free tanh layer's output, written as
    sqrt(sum(h**2)); two input rows are all zeros (missing features), so h = 0.

    Evidence: the forward stays finite, yet the gradients turn NaN at the first batch
    that holds a zero row; the guard (on in this demo) skips the update and pauses.
    Press a (or 10a): the report names the backward op PowBackward0 and, from its
    forward traceback, the module ``magnitude``; the forward outputs are all finite.
    Fix (``--fixed``): ``torch.linalg.vector_norm``, whose gradient at 0 is 0.
    """
    train, val = teacher_regression(2048, 512)
    gen = torch.Generator().manual_seed(1)
    zero_rows = torch.randperm(len(train), generator=gen)[:2]
    train.x[zero_rows] = 0.0
    model = nn.Sequential(OrderedDict([
        ("encoder", nn.Linear(16, 32, bias=False)), ("act", nn.Tanh()),
        ("magnitude", Magnitude(stable=fixed)), ("head", nn.Linear(1, 1))]))
    return Setup(model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(),
                 train, val, steps=400, watch_delay=0.05, guard=True)


BUILDERS: dict[str, Callable[[bool], Setup]] = {
    "healthy": healthy,
    "exploding": exploding,
    "nan-forward": nan_forward,
    "nan-backward": nan_backward,
}

assert set(BUILDERS) == set(SCENARIOS), "demo.catalog and demo.scenarios disagree"
