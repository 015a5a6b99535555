"""A classifier trained with ``nn.NLLLoss`` on its raw scores: NLLLoss expects
log-probabilities, so the loss is minus the right class's score and goes negative
without bound. Fixed (``--fixed``): the model ends with ``nn.LogSoftmax``."""

import sys

import torch
from torch import nn


def train(fixed: bool, steps: int = 30) -> str:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4)]
    if fixed:
        layers.append(nn.LogSoftmax(dim=1))
    model = nn.Sequential(*layers)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(4, 10, generator=g) * 2
    for _ in range(steps):
        y = torch.randint(0, 4, (32,), generator=g)
        x = centers[y] + torch.randn(32, 10, generator=g)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(fixed="--fixed" in sys.argv))
