"""The scenarios of the step's time and memory: a loop that waits for its data, one that
keeps every step's graph, one whose memory creeps. (The job whose rank straggles is
``demo.ddp``'s.)

Each builder's docstring says the bug, the evidence to look for on screen, and the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from demo.data import teacher_regression
from demo.setups import Setup, mlp

#: What the input-bound loader takes for each batch: about 60% of a step whose compute
#: (a 256-wide MLP on 128 rows, on one CPU thread) takes about 5 ms.
SLOW_LOADER_S = 0.008


def input_bound(fixed: bool = False) -> Setup:
    """The loader takes 8 ms to hand over each batch (it sleeps, as a loader that reads
    and decodes on the training loop's own thread does) for a step that computes in
    about 5 ms: the loop waits for its data most of the time.

    Evidence: input_bound (an error: the wait is above half of the step) with the data
    share, the wait and the step in milliseconds; the loss learns as the healthy run's,
    only slower. Fix (``--fixed``): the batches are ready when the loop asks for them,
    as a DataLoader with num_workers (and prefetch_factor) makes them; here the wait is
    removed.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 256, 2)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=300,
        batch_size=128,
        # No pause between the steps: to the probe it would be one more wait for data.
        watch_delay=0.0,
        data_delay=0.0 if fixed else SLOW_LOADER_S,
    )


def retained_graph(fixed: bool = False) -> Setup:
    """The loop sums its losses for the run's mean as tensors, ``total_loss += loss``
    (the bug of PyTorch's FAQ): the total is then part of every step's autograd graph,
    so each step's graph stays alive, chained to the next, until the run ends.

    Evidence: retained_graph: the loss of earlier steps still in a live graph, the
    oldest of them named; nothing else looks wrong (the loss falls as the healthy
    run's). Fix (``--fixed``): ``total_loss += loss.item()``, a number.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=600,
        keep_graph=not fixed,
    )


def memory_creep(fixed: bool = False) -> Setup:
    """The loop keeps a copy of the weights after every update, for a later look, in a
    history that never evicts: 70k parameters, 282 KB a step, 169 MB over the run.

    Evidence: memory_creep: the process's resident memory (rss) grows step after step
    without levelling off, with the growth and its pace a step. Fix (``--fixed``): a
    bounded history, the last 8 copies (``deque(maxlen=8)``).
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 256, 2)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=600,
        snapshots=8 if fixed else None,
    )


RESOURCE_BUILDERS: dict[str, Callable[[bool], Setup]] = {
    "input-bound": input_bound,
    "retained-graph": retained_graph,
    "memory-creep": memory_creep,
}
