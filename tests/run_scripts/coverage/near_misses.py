"""Trainings whose optimizers hold part of what the script runs, rightly: each one
after the other in one unmodified script, each with model classes of its own (a run
is named after its model). ``traintop run`` raises nothing on any of them.

- linear probing: the backbone frozen (``requires_grad=False``), the head trained;
- a backbone run apart under ``torch.no_grad()`` (its parameters still trainable);
- a model whose forward runs its backbone under ``torch.no_grad()``;
- two optimizers, the body's and the head's (other settings);
- an EMA copy (``AveragedModel``) evaluated under ``no_grad``;
- a GAN: two networks, two optimizers;
- forward-forward: one optimizer per layer, each layer's own loss.
"""

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 40


def backbone(width: int = 8) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )


class Classifier(nn.Module):
    head = nn.Linear

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.backbone = backbone(width)
        self.fc = self.head(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(x))


class ProbeHead(nn.Linear):
    pass


class InsideHead(nn.Linear):
    pass


class LinearProbe(Classifier):
    head = ProbeHead


class BodyAndHead(Classifier):
    pass


class EmaClassifier(Classifier):
    pass


class NoGradInside(Classifier):
    head = InsideHead

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        return self.fc(features)


class ApartHead(nn.Linear):
    pass


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, 4, (16,), generator=g)
    return torch.randn(16, 3, 8, 8, generator=g) + y.view(-1, 1, 1, 1) * 0.5, y


def fit(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> float:
    for step in range(STEPS):
        x, y = batch(step)
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
    return loss.item()


def linear_probing() -> float:
    model = LinearProbe()
    model.backbone.requires_grad_(False)
    return fit(model, [torch.optim.SGD(model.fc.parameters(), lr=0.1)])


def no_grad_apart() -> float:
    features, head = backbone(), ApartHead(8, 4)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step)
        with torch.no_grad():
            f = features(x)
        optimizer.zero_grad()
        loss = F.cross_entropy(head(f), y)
        loss.backward()
        optimizer.step()
    return loss.item()


def no_grad_inside() -> float:
    model = NoGradInside()
    return fit(model, [torch.optim.Adam(model.fc.parameters(), lr=1e-3)])


def body_and_head() -> float:
    model = BodyAndHead()
    body = [p for name, p in model.named_parameters() if not name.startswith("fc.")]
    return fit(
        model,
        [
            torch.optim.SGD(body, lr=0.05, momentum=0.9),
            torch.optim.Adam(model.fc.parameters(), lr=1e-3),
        ],
    )


def ema() -> float:
    model = EmaClassifier()
    averaged = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        averaged.update_parameters(model)
        if step % 10 == 9:
            averaged.eval()
            with torch.no_grad():
                F.cross_entropy(averaged(batch(1000 + step)[0]), batch(1000 + step)[1])
    return loss.item()


class Generator(nn.Sequential):
    pass


class Discriminator(nn.Sequential):
    pass


def gan() -> float:
    g = Generator(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    d = Discriminator(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3, betas=(0.5, 0.999))
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(step)
        real = torch.randn(32, 2, generator=gen) * 0.5 + 2
        fake = g(torch.randn(32, 4, generator=gen))
        opt_d.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(d(real), ones)
        d_loss = d_loss + F.binary_cross_entropy_with_logits(d(fake.detach()), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(d(fake), ones)
        g_loss.backward()
        opt_g.step()
    return g_loss.item()


class FFLayer(nn.Linear):
    pass


def forward_forward() -> float:
    layers = nn.ModuleList([FFLayer(32, 32), FFLayer(32, 32)])
    optimizers = [torch.optim.Adam(layer.parameters(), lr=0.03) for layer in layers]
    total = 0.0
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(step)
        pos, neg = torch.randn(16, 32, generator=gen) + 1, torch.randn(16, 32, generator=gen)
        total = 0.0
        for layer, optimizer in zip(layers, optimizers, strict=True):
            pos = pos / (pos.norm(dim=1, keepdim=True) + 1e-4)
            neg = neg / (neg.norm(dim=1, keepdim=True) + 1e-4)
            g_pos = F.relu(layer(pos)).pow(2).mean(1)
            g_neg = F.relu(layer(neg)).pow(2).mean(1)
            loss = F.softplus(torch.cat([2.0 - g_pos, g_neg - 2.0])).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            pos, neg = F.relu(layer(pos)).detach(), F.relu(layer(neg)).detach()
    return total


TRAININGS = [
    linear_probing,
    no_grad_apart,
    no_grad_inside,
    body_and_head,
    ema,
    gan,
    forward_forward,
]


def train() -> str:
    losses = []
    for training in TRAININGS:
        torch.manual_seed(0)
        losses.append(training())
    return f"result {losses[0]!r} {sum(losses)!r}"


if __name__ == "__main__":
    print(train())
