"""Healthy recipes (``tests/bench/healthy_recipes.py``): language models and
classifiers trained the way public scripts train them, shrunk to a few seconds.

nanoGPT (param groups, warmup + cosine, clip 1.0, 4 micro-steps a step), minGPT's
Trainer (its sort demo), the mnist example's CNN with label smoothing and a plain-CE
validation, mixup with soft targets, an EMA model evaluated, a linear probe, per-group
learning rates, SGD + OneCycleLR, ReduceLROnPlateau, a 4-layer MLP under Adam at 1e-2
(issue 29's false ``exploding_gradient``), gradient checkpointing, Adam written by hand,
a ``torch.compile``d model (``healthy_loops.py``: gradient checkpointing, Adam by
hand, a compiled model).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests.bench.healthy_recipes import Bench, Recipe, Trained
from tests.runtime.test_update_ratio_healthy import learnable_text

# --- data: synthetic but learnable ---------------------------------------------------------


def teacher_data(
    n: int = 4096, dim: int = 20, classes: int = 4, flip: float = 0.0, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Points labelled by a fixed random linear teacher (the same for every ``seed``: a
    seed draws other points of the same task), ``flip``: a share of labels drawn at
    random instead, so the loss cannot reach zero."""
    teacher = torch.randn(dim, classes, generator=torch.Generator().manual_seed(1000 + dim))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = (x @ teacher).argmax(1)
    noisy = torch.rand(n, generator=g) < flip
    y[noisy] = torch.randint(0, classes, (int(noisy.sum()),), generator=g)
    return x, y


def batches(
    x: torch.Tensor, y: torch.Tensor, size: int = 64
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches, epoch after epoch."""
    g = torch.Generator().manual_seed(1)
    while True:
        order = torch.randperm(len(x), generator=g)
        for at in range(0, len(x) - size + 1, size):
            index = order[at : at + size]
            yield x[index], y[index]


def images(n: int = 2048, classes: int = 4, side: int = 12, seed: int = 0) -> Any:
    """1-channel images: a class's fixed pattern plus noise (the mnist example's shape)."""
    patterns = torch.randn(classes, 1, side, side, generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(seed)  # (a seed: other images of the same classes)
    y = torch.randint(0, classes, (n,), generator=g)
    x = patterns[y] + 1.5 * torch.randn(n, 1, side, side, generator=g)
    return x, y


def mlp(sizes: list[int], norm: type[nn.Module] | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers += [norm(b), nn.ReLU()] if norm else [nn.ReLU()]
    return nn.Sequential(*layers)


# --- nanoGPT and minGPT ---------------------------------------------------------------------


class Block(nn.Module):
    """nanoGPT's Block: pre-LayerNorm causal self-attention and a GELU MLP."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.attn_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.c_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads = heads
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        x = x + self.resid_drop(self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        return x + self.resid_drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class TinyGPT(nn.Module):
    """nanoGPT's GPT (minGPT's without weight tying), shrunk; ``dropout`` on the
    embeddings, the attention and the residual branches, as both place it."""

    def __init__(
        self,
        vocab: int,
        block: int,
        dim: int = 32,
        layers: int = 2,
        tied: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(dim, 2, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("attn_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


def nanogpt(bench: Bench, steps: int) -> None:
    """nanoGPT's train.py: AdamW with weight decay on the 2-D weights only, linear warmup
    then cosine decay to lr/10, 4 micro-steps of loss/4, clip 1.0, a GradScaler that is
    off in float32 (as the script builds it)."""
    text, block, batch, accum = learnable_text(), 16, 8, 4
    model = TinyGPT(16, block)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), fused=False)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    warmup, max_lr, min_lr = 100, 1e-3, 1e-4

    def get_lr(it: int) -> float:
        if it < warmup:
            return max_lr * (it + 1) / (warmup + 1)
        ratio = min(1.0, (it - warmup) / (steps - warmup))
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(text) - block - 1, (batch,))
        x = torch.stack([text[i : i + block] for i in ix.tolist()])
        return x, torch.stack([text[i + 1 : i + 1 + block] for i in ix.tolist()])

    x, y = get_batch()
    with bench.watch(model, optimizer) as probe:
        for it in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = get_lr(it)
            with probe.step():
                total = 0.0
                for _ in range(accum):
                    loss = model(x, y) / accum
                    x, y = get_batch()
                    scaler.scale(loss).backward()
                    total += loss.item()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                probe.log(loss=total)


def sort_data(n: int = 4096, length: int = 6, digits: int = 3) -> tuple[torch.Tensor, ...]:
    """minGPT's demo: sort ``length`` digits; the targets of the input half are -1."""
    g = torch.Generator().manual_seed(0)
    inp = torch.randint(digits, (n, length), generator=g)
    cat = torch.cat([inp, inp.sort(1).values], dim=1)
    x, y = cat[:, :-1].clone(), cat[:, 1:].clone()
    y[:, : length - 1] = -1
    return x, y


def mingpt(bench: Bench, steps: int) -> None:
    """minGPT's Trainer on its sort demo: AdamW (0.9, 0.95) at 5e-4, decay 0.1 on the
    Linear weights only (its configure_optimizers), clip 1.0, no schedule, and its
    GPT's default dropout of 0.1 (embeddings, attention, residuals)."""
    x, y = sort_data()
    model = TinyGPT(3, 11, dim=32, tied=False, dropout=0.1)
    decay = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    named = dict(model.named_parameters())
    groups = [
        {"params": [p for n, p in named.items() if n in decay], "weight_decay": 0.1},
        {"params": [p for n, p in named.items() if n not in decay], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=5e-4, betas=(0.9, 0.95))
    data = batches(x, y, 32)
    with bench.watch(model, optimizer) as probe:
        for _ in range(steps):
            xb, yb = next(data)
            with probe.step():
                loss = model(xb, yb)
                model.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                probe.log(loss=loss)


# --- classifiers ---------------------------------------------------------------------------


class Net(nn.Module):
    """The mnist example's Net (two convs, dropout, two Linear), for 12x12 images."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, 1), nn.Conv2d(8, 16, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(16 * 4 * 4, 32), nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout1(x).flatten(1)
        return self.fc2(self.dropout2(F.relu(self.fc1(x))))


def validate(probe: Any, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """A plain-CE validation pass: model.eval(), no_grad, back to train()."""
    with probe.evaluate():
        model.eval()
        with torch.no_grad():
            loss = F.cross_entropy(model(x), y)
        model.train()
        probe.log(val_loss=loss)
    return float(loss)


def label_smoothing(bench: Bench, steps: int) -> None:
    """The mnist example (Adadelta at 1.0, StepLR 0.7 an epoch of 100 steps) with label
    smoothing 0.1 in training and a plain-CE validation every 100 steps."""
    x, y = images()
    vx, vy = images(256, seed=1)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    data = batches(x, y, 64)
    with bench.watch(model, optimizer) as probe:
        for i in range(steps):
            xb, yb = next(data)
            with probe.step():
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb, label_smoothing=0.1)
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
            if (i + 1) % 100 == 0:
                validate(probe, model, vx, vy)
                scheduler.step()


def mixup(bench: Bench, steps: int) -> None:
    """mixup (alpha 1) with soft targets (timm's SoftTargetCrossEntropy), SGD 0.1
    momentum 0.9 weight decay 1e-4, as mixup-cifar10."""
    x, y = teacher_data(classes=4)
    model = mlp([20, 128, 128, 4], nn.BatchNorm1d)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    beta = torch.distributions.Beta(1.0, 1.0)
    data = batches(x, y, 64)
    with bench.watch(model, optimizer) as probe:
        for _ in range(steps):
            xb, yb = next(data)
            lam = float(beta.sample())
            index = torch.randperm(len(xb))
            mixed = lam * xb + (1 - lam) * xb[index]
            target = lam * F.one_hot(yb, 4).float() + (1 - lam) * F.one_hot(yb[index], 4).float()
            with probe.step():
                loss = torch.sum(-target * F.log_softmax(model(mixed), dim=-1), dim=-1).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


def ema(bench: Bench, steps: int) -> None:
    """AdamW and an EMA copy (``AveragedModel``, decay 0.999) updated each step; the EMA
    model validated every 100 steps."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    x, y = teacher_data(classes=4)
    vx, vy = teacher_data(512, classes=4, seed=1)
    model = mlp([20, 64, 64, 4])
    averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(x, y, 64)
    with bench.watch(model, optimizer) as probe:
        for i in range(steps):
            xb, yb = next(data)
            with probe.step():
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                optimizer.step()
                averaged.update_parameters(model)
                probe.log(loss=loss)
            if (i + 1) % 100 == 0:
                validate(probe, averaged, vx, vy)


def linear_probe(bench: Bench, steps: int) -> None:
    """Linear evaluation (MoCo's): the backbone frozen (requires_grad False, eval mode
    for its BatchNorm), only the head in SGD (0.1, momentum 0.9)."""
    x, y = teacher_data(classes=4)
    backbone = mlp([20, 128, 128], nn.BatchNorm1d)
    head = nn.Linear(128, 4)
    model = nn.Sequential(backbone, head)
    for p in backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)
    data = batches(x, y, 64)
    with bench.watch(model, optimizer) as probe:
        model.train()
        backbone.eval()
        for _ in range(steps):
            xb, yb = next(data)
            with probe.step():
                loss = F.cross_entropy(model(xb), yb)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


def param_group_lrs(bench: Bench, steps: int) -> None:
    """Fine-tuning with a learning rate a group: backbone 1e-4, head 1e-3 (Adam)."""
    x, y = images()
    model = Net()
    head = [*model.fc1.parameters(), *model.fc2.parameters()]
    backbone = [*model.conv1.parameters(), *model.conv2.parameters()]
    optimizer = torch.optim.Adam([{"params": backbone, "lr": 1e-4}, {"params": head, "lr": 1e-3}])
    data = batches(x, y, 64)
    with bench.watch(model, optimizer) as probe:
        for _ in range(steps):
            xb, yb = next(data)
            with probe.step():
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)


def one_cycle(bench: Bench, steps: int) -> Trained:
    """SGD momentum 0.9 (nesterov, wd 5e-4) with OneCycleLR (max 0.1) stepped each batch;
    watched with ``watch()`` alone: the steps inferred."""
    x, y = teacher_data(classes=4)
    model = mlp([20, 128, 128, 4], nn.BatchNorm1d)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=steps)
    data, losses = batches(x, y, 64), []
    with bench.watch(model, optimizer):
        for _ in range(steps):
            xb, yb = next(data)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return Trained(losses)


def plateau(bench: Bench, steps: int) -> Trained:
    """Regression, Adam 1e-3, ReduceLROnPlateau (factor 0.5, patience 2) on a
    validation MSE every 50 steps; ``watch()`` alone: steps and evaluations inferred."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4096, 4, generator=g) * 4 - 2
    y = (torch.sin(2 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] - 0.5 * x[:, 3:]).detach()
    vx, vy = x[:512] + 0.01, y[:512]
    model = mlp([4, 64, 64, 1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=2)
    data, losses = batches(x, y, 64), []
    with bench.watch(model, optimizer):
        for i in range(steps):
            xb, yb = next(data)
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if (i + 1) % 50 == 0:
                model.eval()
                with torch.no_grad():
                    val = F.mse_loss(model(vx), vy)
                model.train()
                scheduler.step(val)
    return Trained(losses)


def adam_mlp(lr: float = 1e-2, name: str = "adam-mlp-lr1e-2", steps: int = 1000) -> Recipe:
    """A 4-layer MLP under Adam at ``lr`` on 10 classes (10% labels flipped): the loss
    falls 2.31 -> ~0.4 (issue 29 reported a false ``exploding_gradient`` here)."""

    def run(bench: Bench, steps: int) -> None:
        x, y = teacher_data(10000, 32, classes=10, flip=0.1)
        model = mlp([32, 128, 128, 128, 10])
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        data = batches(x, y, 128)
        with bench.watch(model, optimizer) as probe:
            for _ in range(steps):
                xb, yb = next(data)
                with probe.step():
                    optimizer.zero_grad()
                    loss = F.cross_entropy(model(xb), yb)
                    loss.backward()
                    optimizer.step()
                    probe.log(loss=loss)

    return Recipe(name, "one backward", "watch + step()", steps, run)


RECIPES = [
    Recipe("nanogpt", "accum 4 + clip + GradScaler(off)", "watch + step()", 1000, nanogpt),
    Recipe("mingpt-trainer", "one backward + clip", "watch + step()", 1000, mingpt),
    Recipe("label-smoothing+val", "one backward + eval", "watch + step() + evaluate()", 1000,
           label_smoothing),
    Recipe("mixup", "one backward, soft targets", "watch + step()", 1000, mixup),
    Recipe("ema-eval", "one backward + EMA + eval", "watch + step() + evaluate()", 1000, ema),
    Recipe("linear-probe", "frozen backbone", "watch + step()", 1000, linear_probe),
    Recipe("param-group-lrs", "one backward, 2 lr groups", "watch + step()", 1000,
           param_group_lrs),
    Recipe("sgd-onecycle", "one backward + sched", "watch() alone (inferred)", 1000, one_cycle),
    Recipe("plateau", "one backward + val + sched", "watch() alone (inferred)", 1000, plateau),
    adam_mlp(),
]  # fmt: skip
