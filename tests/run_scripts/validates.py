"""A loop that validates every epoch the commonest ways: ``F.cross_entropy(model(x), y)``
(the function looked up before the forward), a name imported at the top, and an ``nn``
loss module. Prints each evaluation's loss as the script computes it."""

import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.functional import cross_entropy

HOW = sys.argv[1] if len(sys.argv) > 1 else "functional"


def validation_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if HOW == "imported":
        return cross_entropy(model(x), y)
    if HOW == "module":
        return nn.CrossEntropyLoss()(model(x), y)
    return F.cross_entropy(model(x), y)


def train(epochs: int = 3, steps: int = 6) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x_val, y_val = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(epochs):
        model.train()
        for _ in range(steps):
            x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            print(f"validation {validation_loss(model, x_val, y_val).item()!r}", flush=True)


if __name__ == "__main__":
    train()
