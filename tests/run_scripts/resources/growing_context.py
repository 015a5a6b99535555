"""A compiled model trained on a context that grows every 10 steps (a curriculum), compiled
with ``dynamic=False``: every new length compiles the model again. ``--dynamic`` lets
torch.compile make the length dynamic after its second shape (its default).
(The eager backend: Inductor would take minutes a compilation on this machine's CPU.)"""

import sys

import torch
from torch import nn


def train(dynamic: bool, steps: int = 240) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(32, 32), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    compiled = torch.compile(model, backend="eager", dynamic=None if dynamic else False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        length = 8 + step // 10  # the curriculum
        g = torch.Generator().manual_seed(step)
        start = torch.randint(0, 32, (16, 1), generator=g)
        tokens = (start + torch.arange(length + 1)) % 32  # each token the last one plus one
        optimizer.zero_grad()
        logits = compiled(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(dynamic="--dynamic" in sys.argv))
