"""Synthetic frames, as a probe would send them (for monitor-side tests)."""

from __future__ import annotations

import math
from typing import Any

from probes.wire import make_frame

Frame = dict[str, Any]
LAYERS = ["encoder.0", "encoder.2", "head"]


def hello(run: str = "run-a", name: str = "mlp", layers: list[str] | None = None) -> Frame:
    layers = LAYERS if layers is None else layers
    return make_frame("hello", run=run, name=name, pid=123, host="box", rank=0, world_size=1,
                      torch="2.13.0", layers=layers, param_counts=[10] * len(layers),
                      config={"every": 1, "sample_every": 10})


def step(index: int, run: str = "run-a", loss: float | None = None, *, seq: int | None = None,
         grad_norms: list[float | None] | None = None, layers: int = len(LAYERS),
         t0: float = 1000.0, rate: float = 100.0) -> Frame:
    loss = 1.0 / (1 + index) if loss is None else loss
    grads = grad_norms if grad_norms is not None else [0.5 + 0.1 * i + 0.01 * index
                                                        for i in range(layers)]
    frame = make_frame("step", run=run, step=index, time=t0 + index / rate, duration=0.01,
                       scalars={"loss": loss}, lr=[1e-3], grad_norms=grads,
                       grad_norm_total=math.sqrt(sum((g or 0.0) ** 2 for g in grads)),
                       none_grads=0, dropped=0, seq=index + 1 if seq is None else seq)
    if index % 10 == 0:
        frame["param_norms"] = [5.0 + i for i in range(layers)]
    return frame


def evaluation(index: int, run: str = "run-a", val_loss: float = 0.5, seq: int = 1) -> Frame:
    return make_frame("eval", run=run, step=index, time=1000.0 + index / 100,
                      scalars={"val_loss": val_loss}, forwards=1, train_mode_forwards=0,
                      grad_forwards=0, seq=seq)


def short_run(steps: int = 30, run: str = "run-a", name: str = "mlp") -> list[Frame]:
    """A hello, ``steps`` step frames and an eval every 10 steps."""
    frames = [hello(run, name)]
    for i in range(steps):
        frames.append(step(i, run))
        if i % 10 == 9:
            frames.append(evaluation(i, run, val_loss=0.6 - 0.01 * i, seq=i // 10 + 1))
    return frames
