"""Healthy recipes (``tests/bench/healthy_recipes.py``) of special shapes: a DCGAN, a
VAE, a Gaussian NLL whose loss goes below zero, REINFORCE, a contrastive loss, AMP (fp16
and bf16 autocast with a GradScaler; two optimizers under one scaler), and the three
runs of ``tests/runtime/test_update_ratio_healthy.py`` (LBFGS, forward-forward, an LSTM LM by
hand at lr 20), reused as they are written there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

import tests.runtime.test_update_ratio_healthy as written
from tests.bench.healthy_models import batches, mlp, teacher_data
from tests.bench.healthy_recipes import Bench, Recipe, Trained, mean

# --- DCGAN, as pytorch/examples/dcgan ------------------------------------------------------


def bars(n: int, side: int = 8, generator: torch.Generator | None = None) -> torch.Tensor:
    """Images in (-1, 1): a bright horizontal bar two rows high at a random row."""
    rows = torch.randint(0, side - 1, (n,), generator=generator)
    out = torch.full((n, 1, side, side), -0.5)
    for i, r in enumerate(rows.tolist()):
        out[i, 0, r : r + 2] = 0.5
    return out + 0.1 * torch.randn(out.shape, generator=generator)


def weights_init(m: nn.Module) -> None:
    """The example's init: conv N(0, 0.02), BatchNorm weight N(1, 0.02), bias 0."""
    if isinstance(m, nn.Conv2d | nn.ConvTranspose2d):
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def dcgan_nets(nz: int = 16, nf: int = 16) -> tuple[nn.Module, nn.Module]:
    """The example's Generator and Discriminator (transposed convolutions, BatchNorm,
    ReLU and Tanh; strided convolutions, LeakyReLU 0.2, BatchNorm, Sigmoid), two
    layers each for 8x8 images (CPU convolutions are slow)."""
    generator = nn.Sequential(
        nn.ConvTranspose2d(nz, nf, 4, 1, 0, bias=False),
        nn.BatchNorm2d(nf),
        nn.ReLU(True),
        nn.ConvTranspose2d(nf, 1, 4, 2, 1, bias=False),
        nn.Tanh(),
    )
    discriminator = nn.Sequential(
        nn.Conv2d(1, nf, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(nf, nf * 2, 3, 1, 1, bias=False),
        nn.BatchNorm2d(nf * 2),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(nf * 2, 1, 4, 1, 0, bias=False),
        nn.Sigmoid(),
    )
    generator.apply(weights_init)
    discriminator.apply(weights_init)
    return generator, discriminator


def image_gap(fake: torch.Tensor, real: torch.Tensor) -> float:
    """How far generated images are from real ones: the per-pixel mean's and standard
    deviation's mean absolute difference."""
    gap = (fake.mean(0) - real.mean(0)).abs().mean() + (fake.std(0) - real.std(0)).abs().mean()
    return float(gap)


def dcgan(bench: Bench, steps: int) -> Trained:
    """D: errD_real.backward(), errD_fake.backward() (accumulated), optimizerD.step();
    G through D; Adam 2e-4 (0.5, 0.999) both; every 500 iterations G samples its fixed
    noise under no_grad, still in train mode (the tutorial's progress images). Both
    nets watched (a ModuleDict) with both optimizers; a step is one iteration."""
    nz, batch = 16, 32
    g = torch.Generator().manual_seed(0)
    net_g, net_d = dcgan_nets(nz)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(64, nz, 1, 1)
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    reference = bars(256, generator=g)
    with torch.no_grad():
        before = image_gap(net_g(fixed_noise), reference)
    samples = []
    both = nn.ModuleDict({"G": net_g, "D": net_d})
    with bench.watch(both, [optimizer_d, optimizer_g]) as probe:
        for i in range(steps):
            real = bars(batch, generator=g)
            with probe.step():
                net_d.zero_grad()
                label = torch.full((batch,), 1.0)
                err_d_real = criterion(net_d(real).view(-1), label)
                err_d_real.backward()
                fake = net_g(torch.randn(batch, nz, 1, 1))
                label.fill_(0.0)
                err_d_fake = criterion(net_d(fake.detach()).view(-1), label)
                err_d_fake.backward()
                optimizer_d.step()
                net_g.zero_grad()
                label.fill_(1.0)
                err_g = criterion(net_d(fake).view(-1), label)
                err_g.backward()
                optimizer_g.step()
                if i % 500 == 0 or i == steps - 1:
                    with torch.no_grad():
                        samples.append(net_g(fixed_noise).detach())
                probe.log(loss=err_d_real + err_d_fake + err_g, loss_d=err_d_real + err_d_fake)
    after = image_gap(samples[-1], reference)
    return Trained(learned=after < 0.5 * before, evidence=f"{before:.2f}→{after:.2f}")


# --- VAE, as pytorch/examples/vae ----------------------------------------------------------


class VAE(nn.Module):
    """The example's VAE (fc1, fc21/fc22, fc3, fc4), for 8x8 binary images."""

    def __init__(self, pixels: int = 64, hidden: int = 64, latent: int = 8) -> None:
        super().__init__()
        self.fc1, self.fc21, self.fc22 = (
            nn.Linear(pixels, hidden),
            nn.Linear(hidden, latent),
            nn.Linear(hidden, latent),
        )
        self.fc3, self.fc4 = nn.Linear(latent, hidden), nn.Linear(hidden, pixels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h1), self.fc22(h1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def vae(bench: Bench, steps: int) -> None:
    """BCE (reduction='sum') + KLD, Adam 1e-3, batches of 128."""
    g = torch.Generator().manual_seed(0)
    prototypes = (torch.rand(8, 64, generator=g) < 0.5).float()
    which = torch.randint(0, 8, (4096,), generator=g)
    flips = (torch.rand(4096, 64, generator=g) < 0.05).float()
    data = (prototypes[which] - flips).abs()
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = batches(data, which, 128)
    with bench.watch(model, optimizer) as probe:
        for _ in range(steps):
            x, _ = next(loader)
            with probe.step():
                optimizer.zero_grad()
                recon, mu, logvar = model(x)
                bce = F.binary_cross_entropy(recon, x, reduction="sum")
                kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
                loss = bce + kld
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


def gaussian_nll(bench: Bench, steps: int) -> None:
    """A mean and a variance head, ``F.gaussian_nll_loss``, Adam 1e-3: the noise is
    small (std 0.05 to 0.15), so the loss ends well below zero."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4096, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x) + (0.05 + 0.05 * x.abs()) * torch.randn(x.shape, generator=g)
    body = mlp([1, 64, 64, 2])
    optimizer = torch.optim.Adam(body.parameters(), lr=1e-3)
    data = batches(x, y, 128)
    with bench.watch(body, optimizer) as probe:
        for _ in range(steps):
            xb, yb = next(data)
            with probe.step():
                out = body(xb)
                mean_, var = out[:, :1], F.softplus(out[:, 1:]) + 1e-6
                loss = F.gaussian_nll_loss(mean_, yb, var)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


# --- REINFORCE on CartPole, vectorised ------------------------------------------------------


def cartpole_step(state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gym's CartPole-v1 physics for a batch of carts; (next state, still up)."""
    x, x_dot, theta, theta_dot = state.unbind(1)
    force = torch.where(action == 1, 10.0, -10.0)
    cos, sin = torch.cos(theta), torch.sin(theta)
    temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
    theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
    x_acc = temp - 0.05 * theta_acc * cos / 1.1
    tau = 0.02
    new = torch.stack(
        [
            x + tau * x_dot,
            x_dot + tau * x_acc,
            theta + tau * theta_dot,
            theta_dot + tau * theta_acc,
        ],
        1,
    )
    up = (new[:, 0].abs() < 2.4) & (new[:, 2].abs() < 12 * 2 * 3.1415926 / 360)
    return new, up


def reinforce(bench: Bench, steps: int) -> Trained:
    """pytorch/examples' reinforce.py (a 128-unit policy with dropout 0.6, Adam 1e-2,
    gamma 0.99, returns normalised, loss = sum of -log_prob * return), 16 carts at
    once, episodes cut at 30 steps. Its own check: the episodes' mean length closes
    half its gap to the 30 steps."""
    envs, horizon, gamma = 16, 30, 0.99
    policy = nn.Sequential(nn.Linear(4, 128), nn.Dropout(0.6), nn.ReLU(), nn.Linear(128, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    lengths: list[float] = []
    with bench.watch(policy, optimizer) as probe:
        for _ in range(steps):
            with probe.step():
                state = (torch.rand(envs, 4) - 0.5) * 0.1
                alive = torch.ones(envs, dtype=torch.bool)
                log_probs, masks = [], []
                for _ in range(horizon):
                    log_p = F.log_softmax(policy(state), dim=1)  # (Categorical's, cheaper)
                    action = torch.multinomial(log_p.detach().exp(), 1)
                    log_probs.append(log_p.gather(1, action).squeeze(1))
                    action = action.squeeze(1)
                    masks.append(alive.float())
                    state, up = cartpole_step(state, action)
                    alive = alive & up
                    if not alive.any():
                        break
                rewards = torch.stack(masks)  # 1 a step while the pole is up
                returns = torch.zeros_like(rewards)
                running = torch.zeros(envs)
                for t in range(len(rewards) - 1, -1, -1):
                    running = rewards[t] + gamma * running
                    returns[t] = running
                valid = rewards.bool()
                norm = (returns - returns[valid].mean()) / (returns[valid].std() + 1e-8)
                loss = -(torch.stack(log_probs) * norm * rewards).sum() / envs
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
                lengths.append(float(rewards.sum(0).mean()))
    before, after = mean(lengths[:10]), mean(lengths[-50:])
    return Trained(
        learned=after > before + 0.5 * (horizon - before),
        evidence=f"episode length {before:.0f}→{after:.0f} of {horizon}",
    )


def nt_xent(bench: Bench, steps: int) -> None:
    """SimCLR's NT-Xent (temperature 0.1, its ImageNet setting) on two augmented views
    (noise, feature dropout) through an encoder and a projection head, Adam 1e-3."""
    x, _ = teacher_data(classes=4)
    encoder = nn.Sequential(mlp([20, 128, 64], nn.BatchNorm1d), nn.ReLU(), mlp([64, 64, 32]))
    optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    data, temperature = batches(x, x, 128), 0.1

    def view(b: torch.Tensor) -> torch.Tensor:
        return F.dropout(b + 0.3 * torch.randn_like(b), 0.2)

    with bench.watch(encoder, optimizer) as probe:
        for _ in range(steps):
            xb, _ = next(data)
            with probe.step():
                z = F.normalize(encoder(torch.cat([view(xb), view(xb)])), dim=1)
                sim = z @ z.T / temperature
                sim.fill_diagonal_(float("-inf"))
                n = len(xb)
                targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
                loss = F.cross_entropy(sim, targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


# --- AMP -----------------------------------------------------------------------------------


def amp(dtype: torch.dtype) -> Callable[[Bench, int], None]:
    """autocast (CPU, ``dtype``) and a GradScaler: scale, backward, unscale_, clip 1.0,
    step, update (nanoGPT's fp16 path), AdamW 1e-3."""

    def run(bench: Bench, steps: int) -> None:
        x, y = teacher_data(classes=4)
        model = mlp([20, 128, 128, 4], nn.LayerNorm)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        data = batches(x, y, 64)
        with bench.watch(model, optimizer) as probe:
            for _ in range(steps):
                xb, yb = next(data)
                with probe.step():
                    with torch.autocast("cpu", dtype=dtype):
                        loss = F.cross_entropy(model(xb), yb)
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad(set_to_none=True)
                    probe.log(loss=loss)

    return run


def amp_two_optimizers(bench: Bench, steps: int) -> None:
    """The AMP examples' "multiple models, losses and optimizers": two models, two
    losses, two optimizers, one GradScaler (fp16 autocast on CPU)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 16, generator=g)
    target = torch.tanh(x @ torch.randn(16, 4, generator=g))
    model0, model1 = mlp([16, 64, 4]), mlp([16, 64, 4])
    optimizer0 = torch.optim.SGD(model0.parameters(), lr=0.05, momentum=0.9)
    optimizer1 = torch.optim.Adam(model1.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    data = batches(x, target, 64)
    both = nn.ModuleList([model0, model1])
    with bench.watch(both, [optimizer0, optimizer1]) as probe:
        for _ in range(steps):
            xb, yb = next(data)
            with probe.step():
                optimizer0.zero_grad()
                optimizer1.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    out0, out1 = model0(xb), model1(xb)
                    loss0 = F.mse_loss(2 * out0 + 3 * out1, 5 * yb)
                    loss1 = F.mse_loss(3 * out0 - 5 * out1, -2 * yb)
                scaler.scale(loss0).backward(retain_graph=True)
                scaler.scale(loss1).backward()
                scaler.unscale_(optimizer0)
                scaler.step(optimizer0)
                scaler.step(optimizer1)
                scaler.update()
                probe.log(loss=loss0 + loss1)


# --- test_update_ratio_healthy's runs, reused ------------------------------------------------


def reused(run: Callable[[Any, int], Any]) -> Callable[[Bench, int], None]:
    """One of ``tests/runtime/test_update_ratio_healthy.py``'s runs as written there, its
    ``watch_unthinned`` replaced by the bench's watch (this mode's options)."""

    def bench_run(bench: Bench, steps: int) -> None:
        def watch(model: Any, optimizer: Any, collector: Any, **options: Any) -> Any:
            return bench.watch(model, optimizer, **options)

        with mock.patch.object(written, "watch_unthinned", watch):
            run(bench.collector, steps)

    return bench_run


RECIPES = [
    Recipe("dcgan", "2 nets, D's 2 backwards, 2 opts", "watch([G,D], [optD,optG]) + step()",
           1000, dcgan, check="fixed-noise samples' gap to real images"),
    Recipe("vae", "one backward, sum loss", "watch + step()", 1000, vae),
    Recipe("lbfgs-time-sequence", "LBFGS closure", "watch + step()", 1000,
           reused(written.lbfgs_run)),
    Recipe("forward-forward", "layer-local, 2 opts a step", "watch(layers, [opts]) + step()",
           1000, reused(written.forward_forward_run)),
    Recipe("amp-fp16", "autocast fp16 + GradScaler", "watch + step()", 1000,
           amp(torch.float16)),
    Recipe("amp-bf16", "autocast bf16 + GradScaler", "watch + step()", 1000,
           amp(torch.bfloat16)),
    Recipe("amp-two-optimizers", "2 losses, 2 opts, 1 scaler", "watch([m0,m1], [o0,o1]) + step()",
           1000, amp_two_optimizers),
    Recipe("word-lm-by-hand", "by hand lr 20, clip 0.25", "watch(model) + step()", 1000,
           reused(written.by_hand_run)),
    Recipe("gaussian-nll", "one backward, loss < 0", "watch + step()", 1000, gaussian_nll),
    Recipe("reinforce-cartpole", "episode a step, -logp*R", "watch + step()", 1000, reinforce,
           check="episode length"),
    Recipe("simclr-nt-xent", "two views, one backward", "watch + step()", 1000, nt_xent),
]  # fmt: skip
