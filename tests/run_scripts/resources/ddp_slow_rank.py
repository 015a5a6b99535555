"""DistributedDataParallel on gloo, started by torchrun: each rank reads its own shard,
and rank 1's reader is slow (a network disk: it waits before each batch). The others
wait for it in the all-reduce. ``--same-readers`` gives every rank the same reader."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def batches(rank: int, steps: int, slow: bool):
    for step in range(steps):
        if slow:
            time.sleep(0.02)  # the shard's read
        g = torch.Generator().manual_seed(step * 100 + rank)
        yield torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)


def train(even: bool, steps: int = 200) -> str:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in batches(rank, steps, slow=rank == 1 and not even):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    dist.destroy_process_group()
    return f"result{os.environ.get('RANK', '0')} {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(even="--same-readers" in sys.argv))
