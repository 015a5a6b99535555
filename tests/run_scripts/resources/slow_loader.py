"""A loader that decodes each sample as it is asked for (a PNG read per item, the
tutorials' Dataset shape), one process: the loop waits for it every step.
``--decoded`` reads samples decoded once, before training (the near miss)."""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, count: int, decoded: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = (
            torch.randn(count, 64, generator=g),
            torch.randint(0, 4, (count,), generator=g),
        )
        self.decoded = decoded

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.decoded:
            time.sleep(0.0004)  # decoding one image
        return self.x[index], self.y[index]


def train(decoded: bool, steps: int = 160) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 4)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(Images(32 * steps, decoded), batch_size=32, shuffle=True)
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train(decoded="--decoded" in sys.argv))
