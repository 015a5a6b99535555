"""DistributedDataParallel on gloo, one process per rank, started by torchrun."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def train(steps: int = 8) -> str:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    dist.destroy_process_group()
    return f"result{os.environ.get('RANK', '0')} {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train())
