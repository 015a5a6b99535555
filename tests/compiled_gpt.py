"""A tiny GPT with dropout, trained compiled with and without the probe (the compile
tests and ``tests/bench/compiled_overhead.py`` share it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional

VOCAB, CONTEXT, WIDTH, HEADS = 32, 8, 16, 2  # the tests' size: seconds to compile


class Block(nn.Module):
    """Pre-norm attention (dropout in it and after it) and a GELU MLP."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)
        self.p = dropout
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        heads = [
            t.view(batch, time, self.heads, width // self.heads).transpose(1, 2)
            for t in self.qkv(self.ln1(x)).split(width, dim=2)
        ]
        p = self.p if self.training else 0.0
        y = functional.scaled_dot_product_attention(*heads, is_causal=True, dropout_p=p)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(batch, time, width)))
        return x + self.drop(self.out(functional.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a head tied to the token
    embedding."""

    def __init__(
        self,
        dropout: float = 0.1,
        *,
        vocab: int = VOCAB,
        context: int = CONTEXT,
        width: int = WIDTH,
        heads: int = HEADS,
        layers: int = 1,
    ) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def compile_wrapped(model: nn.Module, **how: Any) -> nn.Module:
    return torch.compile(model, **how)  # type: ignore[return-value]


def compile_in_place(model: nn.Module, **how: Any) -> nn.Module:
    model.compile(**how)
    return model


@dataclass
class Trained:
    """What a compiled run left: losses, weights and what dynamo compiled."""

    losses: list[float] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    graphs_after_warm_up: int = 0  # unique graphs compiled once the loop's shapes ran
    graphs: int = 0
    graph_breaks: dict[str, int] = field(default_factory=dict)
    seconds_per_step: list[float] = field(default_factory=list)


Watch = Callable[[nn.Module, torch.optim.Optimizer], Any]


def train_compiled(
    compile_model: Callable[..., nn.Module],
    watch: Watch | None,
    *,
    steps: int = 12,
    warm_up: int = 8,
    seed: int = 0,
    step_api: bool = True,
    **how: Any,
) -> Trained:
    """Train a ``TinyGPT`` compiled by ``compile_model(model, **how)`` for ``steps``
    steps, watched by ``watch(compiled, optimizer)`` (a probe) or bare; an evaluation
    in eval mode after step 5 and one left in training mode after step 7 (the eval
    checks' own case). The probe's step API is used as a framework would: ``with
    probe.step()`` on even steps, ``begin_step``/``end_step`` on odd ones; or, with
    ``step_api=False``, not at all (``watch()`` alone: the probe infers the steps and
    finds the evaluations, and the loop calls nothing of the probe's)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(seed)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    compiled = compile_model(model, **how)
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (steps, 8, CONTEXT + 1), generator=generator)
    trained = Trained()
    probe = watch(compiled, optimizer) if watch is not None else None
    with probe if probe is not None else contextlib.nullcontext():
        for index in range(steps):
            if index == warm_up:
                trained.graphs_after_warm_up = counters["stats"]["unique_graphs"]
            begun = time.perf_counter()
            tokens, targets = data[index, :, :-1], data[index, :, 1:]
            with _step(probe if step_api else None, index):
                optimizer.zero_grad(set_to_none=True)
                loss = functional.cross_entropy(compiled(tokens).flatten(0, 1), targets.flatten())
                loss.backward()
                optimizer.step()
                if probe is not None and step_api:
                    probe.log(loss=loss)
            trained.seconds_per_step.append(time.perf_counter() - begun)
            trained.losses.append(loss.item())
            if index in (5, 7):
                used = probe if step_api else None
                _evaluate(compiled, model, used, tokens, targets, forgotten=index == 7)
    trained.graphs = counters["stats"]["unique_graphs"]
    trained.graph_breaks = dict(counters["graph_break"])
    trained.weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return trained


@contextlib.contextmanager
def _step(probe: Any, index: int) -> Iterator[None]:
    if probe is None:
        yield
    elif index % 2 == 0:
        with probe.step():
            yield
    else:
        probe.begin_step()
        try:
            yield
        finally:
            probe.end_step()


def _evaluate(
    compiled: nn.Module,
    model: nn.Module,
    probe: Any,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    forgotten: bool,
) -> None:
    """A validation pass: in eval mode without gradients, or (``forgotten``) neither."""
    if not forgotten:
        model.eval()
    scope = probe.evaluate() if probe is not None else contextlib.nullcontext()
    grad = contextlib.nullcontext() if forgotten else torch.no_grad()
    with scope, grad:
        loss = functional.cross_entropy(compiled(tokens).flatten(0, 1), targets.flatten())
        if probe is not None:
            probe.log(val_loss=loss)
    model.train()
