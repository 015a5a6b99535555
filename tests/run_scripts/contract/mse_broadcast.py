"""A regression whose model outputs [N, 1] against targets of shape [N]: ``F.mse_loss``
broadcasts them to [N, N], comparing every prediction with every target, and the model
learns the targets' mean. Fixed (``--fixed``): the outputs squeezed to [N]."""

import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn

warnings.simplefilter("ignore", UserWarning)  # torch's warning, silenced as many scripts do


def train(fixed: bool, steps: int = 30) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, generator=g)
    for _ in range(steps):
        x = torch.randn(32, 5, generator=g)
        y = x @ w
        pred = model(x)
        loss = F.mse_loss(pred.squeeze(-1) if fixed else pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(fixed="--fixed" in sys.argv))
