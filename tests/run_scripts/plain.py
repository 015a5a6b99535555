"""A plain PyTorch loop (the tutorials' shape); --no-zero-grad forgets to clear."""

import sys

import torch
from torch import nn


def train(clear: bool, steps: int = 24) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        if clear:
            optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(clear="--no-zero-grad" not in sys.argv))
