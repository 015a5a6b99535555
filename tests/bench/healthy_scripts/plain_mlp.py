"""A plain training script with no traintop line (the tutorials' loop): an MLP on
points labelled by a fixed teacher, Adam 1e-3 and StepLR, a validation pass each
epoch. Run by ``tests/bench/healthy_frameworks.py`` under ``traintop run``.

    python plain_mlp.py --steps 1000 [--delay S] [--losses FILE]
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of sleep a step")
    parser.add_argument("--losses", help="write the training losses here (JSON)")
    args = parser.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 20, generator=g)
    y = (x @ torch.randn(20, 4, generator=g)).argmax(1)
    train_x, train_y, val_x, val_y = x[:3584], y[:3584], x[3584:], y[3584:]
    model = nn.Sequential(
        nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    losses, step, batch = [], 0, 64
    while step < args.steps:
        model.train()
        order = torch.randperm(len(train_x), generator=g)
        for at in range(0, len(order) - batch + 1, batch):
            index = order[at : at + batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[index]), train_y[index])
            loss.backward()
            if args.delay:  # a slower model's step (a sleep between steps: a data wait)
                time.sleep(args.delay)
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step == args.steps:
                break
        scheduler.step()
        model.eval()
        with torch.no_grad():
            val_loss = F.cross_entropy(model(val_x), val_y)
        print(f"step {step} val_loss {val_loss.item():.4f}", flush=True)
    if args.losses:
        with open(args.losses, "w") as handle:
            json.dump(losses, handle)


if __name__ == "__main__":
    main()
