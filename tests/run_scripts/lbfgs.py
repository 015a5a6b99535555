"""LBFGS with a closure (the torch.optim docs' shape)."""

import torch
from torch import nn


def train(steps: int = 6) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        loss = optimizer.step(closure)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train())
