"""The PyTorch FAQ's loop that keeps every step's graph: ``total_loss += loss`` sums the
losses with their autograd history. ``--item`` sums ``loss.item()`` (the FAQ's fix)."""

import sys

import torch
from torch import nn


def train(item: bool, steps: int = 120) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0.0
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() if item else loss
    checksum = sum(p.double().sum().item() for p in model.parameters())
    mean = float(torch.as_tensor(total_loss).detach()) / steps
    return f"result {mean!r} {checksum!r}"


if __name__ == "__main__":
    print(train(item="--item" in sys.argv))
