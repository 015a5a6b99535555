"""Synthetic frames, as a probe would send them (for monitor-side tests)."""

from __future__ import annotations

import math
from typing import Any

from probes.kernel.wire import make_frame

Frame = dict[str, Any]
LAYERS = ["encoder.0", "encoder.2", "head"]


def hello(run: str = "run-a", name: str = "mlp", layers: list[str] | None = None) -> Frame:
    layers = LAYERS if layers is None else layers
    return make_frame(
        "hello",
        run=run,
        name=name,
        pid=123,
        host="box",
        rank=0,
        world_size=1,
        torch="2.13.0",
        layers=layers,
        param_counts=[10] * len(layers),
        config={"every": 1, "sample_every": 10},
    )


def step(
    index: int,
    run: str = "run-a",
    loss: float | None = None,
    *,
    seq: int | None = None,
    grad_norms: list[float | None] | None = None,
    layers: int = len(LAYERS),
    t0: float = 1000.0,
    rate: float = 100.0,
) -> Frame:
    loss = 1.0 / (1 + index) if loss is None else loss
    grads = (
        grad_norms
        if grad_norms is not None
        else [0.5 + 0.1 * i + 0.01 * index for i in range(layers)]
    )
    frame = make_frame(
        "step",
        run=run,
        step=index,
        time=t0 + index / rate,
        duration=0.01,
        scalars={"loss": loss},
        lr=[1e-3],
        grad_norms=grads,
        grad_norm_total=math.sqrt(sum((g or 0.0) ** 2 for g in grads)),
        none_grads=0,
        dropped=0,
        seq=index + 1 if seq is None else seq,
    )
    if index % 10 == 0:
        frame["param_norms"] = [5.0 + i for i in range(layers)]
    return frame


def evaluation(index: int, run: str = "run-a", val_loss: float = 0.5, seq: int = 1) -> Frame:
    return make_frame(
        "eval",
        run=run,
        step=index,
        time=1000.0 + index / 100,
        scalars={"val_loss": val_loss},
        forwards=1,
        train_mode_forwards=0,
        grad_forwards=0,
        seq=seq,
    )


def short_run(steps: int = 30, run: str = "run-a", name: str = "mlp") -> list[Frame]:
    """A hello, ``steps`` step frames and an eval every 10 steps."""
    frames = [hello(run, name)]
    for i in range(steps):
        frames.append(step(i, run))
        if i % 10 == 9:
            frames.append(evaluation(i, run, val_loss=0.6 - 0.01 * i, seq=i // 10 + 1))
    return frames


def exploding_run() -> list[Frame]:
    """``short_run(10)``, then a middle layer's norm grows tenfold a step (4 steps)."""
    frames = short_run(10)
    for i in range(10, 14):
        frames.append(step(i, grad_norms=[0.5, 10.0 ** (i - 9), 1.0]))
    return frames


def deep_run(
    steps: int = 80,
    *,
    run: str = "run-deep",
    name: str = "sigmoid-stack",
    layers: int = 11,
    probe_share: float | None = None,
) -> list[Frame]:
    """A deep stack whose gradients shrink tenfold per layer towards the input (as in
    the ``vanishing`` scenario): the first layers fall under 1e-4 of the last's and
    raise ``vanishing_gradient``; each step may carry the probe's own time."""
    names = [str(2 * i) for i in range(layers)]
    frames = [hello(run, name, layers=names)]
    for i in range(steps):
        wobble = 1.0 + 0.3 * math.sin(i / 3)
        grads = [0.2 * wobble * 10.0 ** (i_layer - layers + 1) for i_layer in range(layers)]
        frame = step(i, run, loss=0.35 + 0.3 / (1 + i / 5), grad_norms=grads, layers=layers)
        if probe_share is not None:
            frame["probe_time"] = probe_share * frame["duration"]
        frames.append(frame)
        if i % 20 == 19:
            frames.append(evaluation(i, run, val_loss=0.4 + 0.2 / (1 + i / 5), seq=i // 20 + 1))
    return frames


def fixed_and_exploding(steps: int = 40) -> list[Frame]:
    """Two runs of one model: ``fixed`` (steady gradients) and ``exploding`` (its norms
    grow 1.5x a step until they overflow to inf at step 30)."""
    frames = [hello("run-fixed", "exploding (fixed)"), hello("run-boom", "exploding")]
    for i in range(steps):
        frames.append(step(i, "run-fixed", loss=0.6 / (1 + i / 8), grad_norms=[0.5, 0.3, 0.2]))
        growth = 1.5**i if i < 30 else math.inf
        loss = 0.6 * growth if i < 30 else math.nan
        frames.append(
            step(i, "run-boom", loss=loss, grad_norms=[0.5 * growth, 0.9 * growth, 0.4 * growth])
        )
    return frames


def anomaly_report(step_index: int = 48, run: str = "run-a") -> Frame:
    """An anomaly step's report as the probe sends it (``nan-forward``'s, shortened)."""
    stats_in = {
        "shape": [64, 1],
        "min": 1.8e-05,
        "max": 1.0,
        "mean": 0.831,
        "abs_max": 1.0,
        "nan": 0,
        "inf": 0,
        "zeros": 0,
    }
    stats_out = {**stats_in, "max": 15.9, "mean": 8.14, "abs_max": 15.9, "inf": 1}
    return make_frame(
        "anomaly",
        run=run,
        step=step_index,
        time=1000.0 + step_index / 100,
        duration=0.00695,
        outcome="non_finite_backward",
        backward_op="SigmoidBackward0",
        module_of_backward_op="prob",
        batch=47,
        update_skipped=True,
        paused=True,
        first_non_finite={
            "name": "log_complement",
            "type": "LogComplement",
            "inputs": [stats_in],
            "output": stats_out,
        },
        forward_traceback=[
            {
                "file": "train.py",
                "line": 47,
                "function": "train",
                "code": "loss = loss_fn(model(x), setup.target(y))",
            },
            {
                "file": "model.py",
                "line": 12,
                "function": "forward",
                "code": "return -torch.log(1 - p)",
            },
        ],
        seq=1,
    )


def check_report(step_index: int = 0, run: str = "run-a") -> Frame:
    """A ``check_split`` report with one finding, as ``probes.check_split`` sends it."""
    text = (
        "check_split: 1 finding(s)\n  rows: {train: 800, val: 100, test: 100}\n"
        "  - leakage: 12 rows of val are also in train\n      e.g. 3, 17, 40, 41, 77\n"
        "      fix: deduplicate before splitting"
    )
    return make_frame(
        "event",
        run=run,
        name="check_report",
        step=step_index,
        check="check_split",
        ok=False,
        summary={},
        findings=["leakage"],
        text=text,
        seq=1,
    )


def probe_alert(
    kind: str, severity: str, step_index: int, run: str = "run-a", seq: int = 1
) -> Frame:
    """An alert raised in the training process (a data check, the guard)."""
    return make_frame(
        "alert",
        run=run,
        step=step_index,
        seq=seq,
        alert={
            "kind": kind,
            "severity": severity,
            "step": step_index,
            "subject": "",
            "evidence": {"rows": 12},
            "signal": f"{kind} found by a check",
            "experiments": ["look at the rows"],
        },
    )


def thinned_as_sent(records: list[Frame], factor: int) -> list[Frame]:
    """Records as a run ``factor`` times faster than the sender's budget would send
    them: the sender's thinning policy (``probes.kernel.thinning.Thinner``), fed as
    the sender feeds it, ``factor`` steps a collect with a budget of one (the first step
    sent alone); other records pass, in order."""
    from probes.kernel.thinning import RECORDS, Thinner

    thinner: Thinner[Frame] = Thinner(RECORDS)
    out: list[Frame] = []
    batch: list[Frame] = []
    steps = 0
    need = factor + 1  # the first collect: the first step alone, then a group
    for record in records:
        batch.append(record)
        steps += record.get("kind") == "step"
        if steps == need:
            out += thinner.thin(batch, 1)
            batch, steps, need = [], 0, factor
    return out + thinner.thin(batch, 1) if batch else out
