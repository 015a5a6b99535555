"""The PyTorch DCGAN tutorial's loop, shrunk to 8x8 bars, unmodified in shape: D and G
separate, D's real and fake backward passes accumulated, G's step through D, and every
``--sample-every`` iterations the fixed noise sampled under ``no_grad`` with G left in
train mode (its BatchNorm), as the tutorial does, for its image grid.

Prints ``result <errD> <errG>`` after the last iteration."""

from __future__ import annotations

import argparse

import torch
from torch import nn

NZ = 8


def bars(n: int, generator: torch.Generator) -> torch.Tensor:
    """8x8 images of one vertical bar in [-1, 1]."""
    images = -torch.ones(n, 1, 8, 8)
    columns = torch.randint(0, 8, (n,), generator=generator)
    images[torch.arange(n), 0, :, columns] = 1.0
    return images


def nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    generator = nn.Sequential(
        nn.ConvTranspose2d(NZ, 32, 4, 1, 0, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(True),
        nn.ConvTranspose2d(32, 1, 4, 2, 1, bias=False),
        nn.Tanh(),
    )
    discriminator = nn.Sequential(
        nn.Conv2d(1, 32, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(32, 1, 4, 1, 0, bias=False),
        nn.Sigmoid(),
    )
    return generator, discriminator


def train(iterations: int = 120, sample_every: int = 50) -> str:
    g = torch.Generator().manual_seed(0)
    net_g, net_d = nets()
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(16, NZ, 1, 1, generator=g)
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    images = []
    err_d = err_g = torch.zeros(())
    for i in range(iterations):
        real = bars(32, g)
        net_d.zero_grad()
        label = torch.full((32,), 1.0)
        err_d_real = criterion(net_d(real).view(-1), label)
        err_d_real.backward()
        noise = torch.randn(32, NZ, 1, 1, generator=g)
        fake = net_g(noise)
        label.fill_(0.0)
        err_d_fake = criterion(net_d(fake.detach()).view(-1), label)
        err_d_fake.backward()
        err_d = err_d_real + err_d_fake
        optimizer_d.step()
        net_g.zero_grad()
        label.fill_(1.0)
        err_g = criterion(net_d(fake).view(-1), label)
        err_g.backward()
        optimizer_g.step()
        if i % sample_every == 0 or i == iterations - 1:
            with torch.no_grad():
                images.append(net_g(fixed_noise).detach().cpu())
    return f"result {float(err_d)} {float(err_g)}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--sample-every", type=int, default=50)
    options = parser.parse_args()
    print(train(options.iterations, options.sample_every), flush=True)
