"""A binary classifier whose model ends with ``nn.Sigmoid``, trained with
``nn.BCEWithLogitsLoss``, which applies a sigmoid itself: the probabilities are squashed
again into [0.5, 0.73] and the loss cannot go below 0.31. Fixed (``--fixed``):
``nn.BCELoss`` on the sigmoid's outputs."""

import sys

import torch
from torch import nn


def train(fixed: bool, steps: int = 30) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
    criterion = nn.BCELoss() if fixed else nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(6, generator=g)
    for _ in range(steps):
        x = torch.randn(64, 6, generator=g)
        y = (x @ w > 0).float().unsqueeze(1)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(fixed="--fixed" in sys.argv))
