"""A small ResNet-style classifier whose optimizer holds the head alone:
``torch.optim.Adadelta(model.fc.parameters())`` (the backbone learns gradients, and is
never stepped). ``--frozen`` freezes the backbone first (linear probing, as intended).
``--all`` gives the optimizer every parameter (the healthy twin)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(out)))


class ResNetSmall(nn.Module):
    def __init__(self, width: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = Block(width)
        self.layer2 = Block(width)
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, 4, (16,), generator=g)
    x = torch.randn(16, 3, 8, 8, generator=g) + y.view(-1, 1, 1, 1) * 0.5
    return x, y


def train(mode: str = "head", steps: int = 40) -> str:
    torch.manual_seed(0)
    model = ResNetSmall()
    if mode == "frozen":
        for name, param in model.named_parameters():
            param.requires_grad_(name.startswith("fc."))
    params = model.parameters() if mode == "all" else model.fc.parameters()
    optimizer = torch.optim.Adadelta(params)
    model.train()
    for step in range(steps):
        x, y = batch(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    mode = "frozen" if "--frozen" in sys.argv else "all" if "--all" in sys.argv else "head"
    print(train(mode))
