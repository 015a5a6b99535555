"""Synthetic data for the scenarios: seeded, in memory, no downloads."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Split:
    """Inputs and targets of one split."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)


def teacher_regression(
    train: int, val: int, *, dim: int = 16, noise: float = 0.1, seed: int = 0
) -> tuple[Split, Split]:
    """y = tanh(x @ w1) @ w2 + noise: learnable by a small MLP, with a noise floor."""
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randn(dim, 32, generator=gen) / dim**0.5
    w2 = torch.randn(32, 1, generator=gen) / 32**0.5
    x = torch.randn(train + val, dim, generator=gen)
    y = torch.tanh(x @ w1) @ w2 + noise * torch.randn(train + val, 1, generator=gen)
    return Split(x[:train], y[:train]), Split(x[train:], y[train:])


class Batches:
    """Endless shuffled mini-batches of a split, from a seeded generator.

    ``delay``: seconds each batch takes to arrive, as from a loader that reads and
    decodes on the training loop's thread (the input-bound and straggler scenarios).
    """

    def __init__(self, split: Split, batch_size: int, seed: int = 0, delay: float = 0.0) -> None:
        self.split = split
        self.batch_size = batch_size
        self.delay = delay
        self._gen = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._at = 0
        self.drawn = -1  # index of the last batch drawn (logged, named in anomaly reports)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)  # the slow loader: the loop waits for its batch
        if self._at + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.split), generator=self._gen)
            self._at = 0
        index = self._order[self._at : self._at + self.batch_size]
        self._at += self.batch_size
        self.drawn += 1
        return self.split.x[index], self.split.y[index]


def teacher_classification(
    train: int, val: int, *, dim: int = 16, classes: int = 4, seed: int = 0
) -> tuple[Split, Split]:
    """Labels from a random linear teacher (argmax of x @ w): learnable, int64 targets."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, classes, generator=gen)
    x = torch.randn(train + val, dim, generator=gen)
    y = (x @ w + 0.3 * torch.randn(train + val, classes, generator=gen)).argmax(dim=1)
    return Split(x[:train], y[:train]), Split(x[train:], y[train:])


def shuffled(split: Split, seed: int = 0) -> Split:
    """The same inputs with their labels permuted: nothing left to learn."""
    gen = torch.Generator().manual_seed(seed)
    return Split(split.x, split.y[torch.randperm(len(split.y), generator=gen)])
