"""SGD written by hand, no optimizer ("What is torch.nn really?"'s shape);
--no-zero-grad forgets to clear the gradients."""

import sys

import torch
from torch import nn


def train(clear: bool, steps: int = 20, lr: float = 0.05) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= p.grad * lr
                if clear:
                    p.grad.zero_()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(clear="--no-zero-grad" not in sys.argv))
