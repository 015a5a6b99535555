"""Models and data for the diagnosis benchmark: none of them is the demo's.

A CNN with batch norm on synthetic images, a GRU and an LSTM language model and a small
transformer on a synthetic Markov language, an LSTM forecaster on a synthetic series,
and deep MLPs (sigmoid, tanh, functional ReLU). Everything is seeded and small enough
to train on one CPU core in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]

# --- data -------------------------------------------------------------------------------


def images(
    count: int, *, classes: int = 4, size: int = 12, seed: int = 0, noise: float = 0.6
) -> Batch:
    """Noisy copies of one random template per class: a CNN learns them in a few
    hundred steps. Inputs [count, 1, size, size], int64 labels."""
    gen = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, 1, size, size, generator=gen)
    labels = torch.randint(0, classes, (count,), generator=gen)
    x = templates[labels] + noise * torch.randn(count, 1, size, size, generator=gen)
    return x, labels


def markov_text(count: int, *, vocab: int = 16, length: int = 13, seed: int = 0) -> torch.Tensor:
    """Token sequences from a sparse random Markov chain (each token has 3 likely
    successors): a small language model learns it quickly. [count, length] int64."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.full((vocab, vocab), -4.0)
    for token in range(vocab):
        successors = torch.randperm(vocab, generator=gen)[:3]
        logits[token, successors] = torch.tensor([2.0, 1.0, 0.5])
    probs = logits.softmax(dim=1)
    tokens = torch.empty(count, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (count,), generator=gen)
    for t in range(1, length):
        tokens[:, t] = torch.multinomial(probs[tokens[:, t - 1]], 1, generator=gen).squeeze(1)
    return tokens


def lm_batch(tokens: torch.Tensor) -> Batch:
    """Inputs and next-token targets of a batch of sequences."""
    return tokens[:, :-1], tokens[:, 1:]


def vectors(count: int, *, dim: int = 16, classes: int = 2, seed: int = 0) -> Batch:
    """Labels from a random linear teacher: separable, int64 labels."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(dim, classes, generator=gen)
    x = torch.randn(count, dim, generator=gen)
    return x, (x @ weight).argmax(dim=1)


def regression(count: int, *, dim: int = 16, seed: int = 0) -> Batch:
    """y = tanh(x @ w1) @ w2 + noise, targets [count, 1]."""
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randn(dim, 32, generator=gen) / dim**0.5
    w2 = torch.randn(32, 1, generator=gen) / 32**0.5
    x = torch.randn(count, dim, generator=gen)
    return x, torch.tanh(x @ w1) @ w2 + 0.1 * torch.randn(count, 1, generator=gen)


def series(count: int, *, length: int = 24, raw_units: bool = True, seed: int = 0) -> Batch:
    """Noisy sines around 300 with amplitude 120 (sales, prices, sensor counts), the
    next value to predict: inputs [count, length, 1], targets [count, 1]. With
    ``raw_units=False`` both are standardised, as they should be."""
    gen = torch.Generator().manual_seed(seed)
    phase = torch.rand(count, 1, generator=gen) * 2 * math.pi
    freq = 0.2 + 0.3 * torch.rand(count, 1, generator=gen)
    t = torch.arange(length + 1).float()
    s = 300 + 120 * torch.sin(freq * t + phase) + 10 * torch.randn(count, length + 1, generator=gen)
    if not raw_units:
        s = (s - s.mean()) / s.std()
    return s[:, :-1, None], s[:, -1:]


def batches(x: torch.Tensor, y: torch.Tensor, size: int, seed: int = 0) -> Iterator[Batch]:
    """Endless shuffled mini-batches."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x) - size + 1, size):
            index = order[start : start + size]
            yield x[index], y[index]


def sequences(tokens: torch.Tensor, size: int, seed: int = 0) -> Iterator[Batch]:
    """Endless shuffled language-model batches (inputs, next tokens)."""
    for chunk, _ in batches(tokens, tokens, size, seed):
        yield lm_batch(chunk)


# --- models -----------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """Two conv + batch-norm blocks and a linear head, with optional dropout and a
    softmax at the end (a bug when the loss is CrossEntropyLoss)."""

    def __init__(self, classes: int = 4, dropout: float = 0.0, softmax: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(16 * 3 * 3, classes)
        self.softmax = softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.head(self.drop(x.flatten(1)))
        return x.softmax(dim=1) if self.softmax else x


class RecurrentLM(nn.Module):
    """Embedding, a GRU or an LSTM, and a linear decoder over the vocabulary."""

    def __init__(self, vocab: int = 16, cell: str = "gru", hidden: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 24)
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn(24, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


class Forecaster(nn.Module):
    """An LSTM over a series and a linear head on its last state."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.rnn = nn.LSTM(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class TinyTransformer(nn.Module):
    """A causal two-layer transformer language model; ``detach_positions`` cuts the
    positional embedding out of the graph (a bug)."""

    def __init__(
        self, vocab: int = 16, dim: int = 32, length: int = 12, detach_positions: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(length, dim)
        layer = nn.TransformerEncoderLayer(
            dim, 2, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.detach_positions = detach_positions
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = self.pos(torch.arange(length))
        if self.detach_positions:
            positions = positions.detach()
        h = self.embed(tokens) + positions
        h = self.encoder(h, mask=self.mask[:length, :length], is_causal=True)
        return self.head(h)


def deep_mlp(
    depth: int, activation: Callable[[], nn.Module], *, dim: int = 16, width: int = 32, out: int = 1
) -> nn.Sequential:
    """``depth`` Linear+activation blocks and a linear output (layers 0, 2, 4, ...)."""
    layers: list[nn.Module] = []
    size = dim
    for _ in range(depth):
        layers += [nn.Linear(size, width), activation()]
        size = width
    layers.append(nn.Linear(size, out))
    return nn.Sequential(*layers)


class FunctionalReluMLP(nn.Module):
    """fc1 -> F.relu -> fc2 -> F.relu -> out: activations written as functions, which
    no module hook sees. ``dead_bias`` initialises fc1's bias so far below zero that
    every unit of the first ReLU is dead from the first step."""

    def __init__(self, dead_bias: float | None = None, dim: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 64)
        self.fc2 = nn.Linear(64, 64)
        self.out = nn.Linear(64, 1)
        if dead_bias is not None:
            with torch.no_grad():
                self.fc1.bias.fill_(dead_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


def kaiming_(model: nn.Module) -> nn.Module:
    """He initialisation for every Linear (a ReLU stack keeps its scale with depth)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            nn.init.zeros_(module.bias)
    return model


def textbook_bce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy written the textbook way: log(1 - sigmoid(z)) is log(0)
    once sigmoid(z) rounds to 1 in float32 (z above about 17)."""
    p = torch.sigmoid(logits)
    return -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p)).mean()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
