"""A small transformer-style MLP (LayerNorm, two Linear layers, a head) trained with
AdamW. ``--bf16``: the whole model in bfloat16 (``model.to(torch.bfloat16)``), no float32
master weights; ``--amp``: float32 weights under ``torch.autocast(bfloat16)``; neither:
float32. ``--lr`` sets the rate (5e-5 by default: a fine-tuning rate, too small for
bfloat16 weights). ``--no-norm`` leaves the LayerNorm out."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int = 32, norm: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width) if norm else nn.Identity()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Tagger(nn.Module):
    def __init__(self, width: int = 32, classes: int = 8, norm: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, width)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's
        self.block = Block(width, norm)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)).mean(1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, 50, (16, 8), generator=g)  # rows 50..99 never in a batch
    return tokens, tokens[:, 0] % 8


def train(lr: float, mode: str, steps: int, norm: bool) -> str:
    torch.manual_seed(0)
    model = Tagger(norm=norm)
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        tokens, labels = batch(step)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "amp"):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--no-norm", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    mode = "bf16" if args.bf16 else "amp" if args.amp else "fp32"
    print(train(args.lr, mode, args.steps, not args.no_norm))
