"""The loop shapes of the matrix, each written as the public scripts write it.

- ``plain``: one backward per update (``optimizer.step()``), the mnist example's loop.
- ``accumulate``: k micro-batches per update, the loss divided by k (nanoGPT's
  ``gradient_accumulation_steps``); one ``probe.step()`` is one update.
- ``closure``: LBFGS with a closure (time_sequence_prediction): many backward passes
  in one ``optimizer.step(closure)``.
- ``by_hand``: no optimizer at all, ``p.data.add_(p.grad, alpha=-lr)`` after clipping
  (word_language_model), watched with ``watch(model)``.
- ``amp``: autocast and ``torch.amp.GradScaler`` (nanoGPT's fp16 path), on CPU.
- the ``torch.compile`` shape is ``plain`` on a compiled model (the case compiles it).

Each keyword is one way to get the loop wrong; its default is the healthy loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OnStep = Callable[[int], None]  # called before a step begins (e.g. unfreeze a backbone)


def evaluate(
    probe: Any, model: nn.Module, val: Batch, loss_fn: LossFn, *, eval_mode: bool = True
) -> None:
    """One validation pass, as the examples write it."""
    with probe.evaluate():
        if eval_mode:
            model.eval()
        with torch.no_grad():
            loss = loss_fn(model(val[0]), val[1])
        model.train()
        probe.log(val_loss=loss)


def _maybe_evaluate(
    probe: Any,
    model: nn.Module,
    val: Batch | None,
    loss_fn: LossFn,
    step: int,
    steps: int,
    every: int,
    eval_mode: bool,
) -> None:
    if val is not None and (step % every == 0 or step == steps - 1):
        evaluate(probe, model, val, loss_fn, eval_mode=eval_mode)


def plain(
    probe: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Iterator[Batch],
    loss_fn: LossFn,
    steps: int,
    *,
    zero_grad: bool = True,
    clip: float | None = None,
    val: Batch | None = None,
    eval_every: int = 25,
    eval_mode: bool = True,
    scheduler: Any = None,
    scheduler_every: int = 1,
    on_step: OnStep | None = None,
) -> None:
    """One backward per update; ``scheduler`` stepped every ``scheduler_every`` steps."""
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        x, y = next(data)
        with probe.step():
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            probe.log(loss=loss)
        if scheduler is not None and (step + 1) % scheduler_every == 0:
            scheduler.step()
        _maybe_evaluate(probe, model, val, loss_fn, step, steps, eval_every, eval_mode)


def accumulate(
    probe: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Iterator[Batch],
    loss_fn: LossFn,
    steps: int,
    *,
    micro: int = 4,
    zero_grad: bool = True,
    divide: bool = True,
    clip: float | None = None,
    val: Batch | None = None,
    eval_every: int = 25,
    on_step: OnStep | None = None,
) -> None:
    """``micro`` backward passes per update; the logged loss is their sum (what the
    update used: the mean when each is divided by ``micro``)."""
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        with probe.step():
            total = torch.zeros(())
            for _ in range(micro):
                x, y = next(data)
                loss = loss_fn(model(x), y)
                if divide:
                    loss = loss / micro
                loss.backward()
                total += loss.detach()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            probe.log(loss=total)
        _maybe_evaluate(probe, model, val, loss_fn, step, steps, eval_every, True)


def closure(
    probe: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Iterator[Batch],
    loss_fn: LossFn,
    steps: int,
    *,
    zero_grad: bool = True,
    val: Batch | None = None,
    eval_every: int = 5,
    eval_mode: bool = True,
) -> None:
    """``optimizer.step(closure)``: the closure clears, forwards and backwards."""
    for step in range(steps):
        x, y = next(data)

        def run_closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            if zero_grad:
                optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss

        with probe.step():
            loss = optimizer.step(run_closure)  # type: ignore[arg-type]
            probe.log(loss=loss)
        _maybe_evaluate(probe, model, val, loss_fn, step, steps, eval_every, eval_mode)


def by_hand(
    probe: Any,
    model: nn.Module,
    lr: float,
    data: Iterator[Batch],
    loss_fn: LossFn,
    steps: int,
    *,
    zero_grad: bool = True,
    clip: float | None = 0.25,
    val: Batch | None = None,
    eval_every: int = 25,
    eval_mode: bool = True,
    decay_every: int | None = None,
) -> None:
    """No optimizer: ``p.data.add_(p.grad, alpha=-lr)``; the lr divided by 4 every
    ``decay_every`` steps (the example anneals it per epoch)."""
    for step in range(steps):
        x, y = next(data)
        with probe.step():
            if zero_grad:
                model.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-lr)
            probe.log(loss=loss)
        if decay_every is not None and (step + 1) % decay_every == 0:
            lr /= 4.0
        _maybe_evaluate(probe, model, val, loss_fn, step, steps, eval_every, eval_mode)


def amp(
    probe: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Iterator[Batch],
    loss_fn: LossFn,
    steps: int,
    *,
    dtype: torch.dtype = torch.float16,
    zero_grad: bool = True,
    clip: float | None = None,
    unscale_before_clip: bool = True,
    val: Batch | None = None,
    eval_every: int = 25,
) -> None:
    """Autocast on CPU and a GradScaler: scale, backward, (unscale_, clip), step, update."""
    scaler = torch.amp.GradScaler("cpu")
    for step in range(steps):
        x, y = next(data)
        with probe.step():
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=dtype):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            if clip is not None:
                if unscale_before_clip:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            probe.log(loss=loss)
        if val is not None and (step % eval_every == 0 or step == steps - 1):
            with torch.autocast("cpu", dtype=dtype):
                evaluate(probe, model, val, loss_fn)


def compiled(model: nn.Module) -> nn.Module:
    """torch.compile with dynamo's tracing and no code generation (``backend="eager"``,
    as tests/runtime/test_compile.py): inductor's C++ build costs minutes on these CPUs."""
    return torch.compile(model, backend="eager")  # type: ignore[return-value]
