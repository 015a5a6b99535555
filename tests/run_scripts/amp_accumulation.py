"""Mixed precision with a GradScaler and gradient accumulation (the AMP recipe's
shape: scale, backward per micro-batch, unscale, clip, scaler.step, update)."""

import torch
from torch import nn

ACCUMULATE = 4


def train(steps: int = 8) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(steps):
        for micro in range(ACCUMULATE):
            g = torch.Generator().manual_seed(step * ACCUMULATE + micro)
            x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATE
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train())
