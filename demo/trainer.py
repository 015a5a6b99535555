"""The bundled trainer: one plain PyTorch loop, instrumented with ``probes.watch``."""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector

import probes
from demo.data import Batches
from demo.setups import Setup


def train(
    setup: Setup,
    *,
    run: str,
    steps: int | None = None,
    delay: float = 0.0,
    seed: int = 0,
    print_every: int = 100,
    **probe_options: Any,
) -> int:
    """Train ``setup`` for ``steps`` steps under a probe; return the number of steps run.

    ``delay`` sleeps in each step (after backward, where a bigger model would compute:
    a sleep between steps would read as a wait for data), so a person can watch a fast
    run unfold;
    ``probe_options`` go to ``probes.watch``.
    """
    torch.manual_seed(seed)
    steps = setup.steps if steps is None else steps
    batches = Batches(setup.train, setup.batch_size, seed=seed, delay=setup.data_delay)
    model, optimizer, loss_fn = setup.model, setup.optimizer, setup.loss_fn
    total_loss: Any = 0.0  # for the run's mean loss, printed at the end
    history: deque[torch.Tensor] = deque(maxlen=setup.snapshots)  # maxlen None: unbounded
    probe_options.setdefault("guard", setup.guard)
    x, y = batches.next()
    retried = False
    with probes.watch(model, optimizer, run=run, **probe_options) as probe:
        if setup.before_training is not None:
            setup.before_training(setup, probe)
        for step in range(steps):
            with probe.step():
                probe.log(batch=batches.drawn)
                if setup.zero_grad:
                    optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), setup.target(y))
                loss.backward()
                if delay:  # (inside the step: the pause reads as the step's, not as data)
                    time.sleep(delay)
                optimizer.step()
                probe.log(loss=loss)
            if setup.keep_graph:
                total_loss += loss  # the bug: a tensor, which keeps this step's graph alive
            else:
                total_loss += loss.item()  # a number: the graph is freed
            if setup.snapshots != 0:  # the weights after each update, kept for a later look
                with torch.no_grad():
                    history.append(parameters_to_vector(model.parameters()))
            # A batch whose update was skipped (guard, anomaly step) is tried once more,
            # so that the anomaly step a person asks for next sees the same batch.
            retried = probe.update_skipped and not retried
            if not retried:
                x, y = batches.next()
            if step % setup.eval_every == 0 or step == steps - 1:
                val_loss = validate(setup, probe)
                if step % print_every == 0 or step == steps - 1:
                    print(f"step {step} loss {loss.item():.4g} val_loss {val_loss:.4g}", flush=True)
    print(f"mean loss {total_loss / steps:.4g} over {steps} steps", flush=True)
    return steps


def validate(setup: Setup, probe: probes.Probe) -> float:
    """Validation the right way: ``model.eval()`` and ``torch.inference_mode()`` (unless
    the scenario's bug is to forget one of them)."""
    model = setup.model
    no_grad = torch.inference_mode() if setup.eval_no_grad else contextlib.nullcontext()
    with probe.evaluate():
        if setup.eval_mode:
            model.eval()
        with no_grad:
            val_loss = setup.loss_fn(model(setup.val.x), setup.target(setup.val.y))
        model.train()
        probe.log(val_loss=val_loss.detach())
    value = float(val_loss)
    return value if math.isfinite(value) else math.nan
