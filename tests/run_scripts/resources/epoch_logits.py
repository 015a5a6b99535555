"""Features kept for an epoch-end embedding plot, on a loop counted in steps: the list
is only cleared at an epoch's end, which never comes (the memory grows every step).
``--per-epoch`` clears it every 50 steps, as an epoch of 50 batches would."""

import sys

import torch
from torch import nn


def train(per_epoch: bool, steps: int = 430) -> str:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(64, 512), nn.ReLU())
    head = nn.Linear(512, 16)
    model = nn.Sequential(encoder, head)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(64, 16, generator=torch.Generator().manual_seed(99))
    kept: list[torch.Tensor] = []
    plotted = 0
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(256, 64, generator=g)
        y = (x @ teacher).argmax(1)
        optimizer.zero_grad()
        features = encoder(x)
        loss = nn.functional.cross_entropy(head(features), y)
        loss.backward()
        optimizer.step()
        kept.append(features.detach())  # 512 KiB a step, for the epoch's embedding plot
        if per_epoch and len(kept) == 50:
            plotted += len(torch.cat(kept))
            kept.clear()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(per_epoch="--per-epoch" in sys.argv))
