"""The scenario gallery's index: names, what breaks, which alert teaches it, where it
shows (no torch: the monitor lists them)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class ScenarioInfo:
    """One failure mode of the lesson, as the gallery presents it."""

    summary: str  # what breaks, in one line
    alerts: tuple[str, ...]  # the alert kinds it must raise (none for healthy)
    subject: str = ""  # the layer, module or field the first alert must name
    view: str = "alerts panel"  # where a person sees it
    fixable: bool = True  # --fixed runs the corrected version
    either: bool = False  # one root cause, raised as any one of ``alerts``


SCENARIOS: dict[str, ScenarioInfo] = {
    "healthy": ScenarioInfo(
        "a small MLP learns a synthetic task; train and validation loss fall together",
        (),
        view="loss chart",
        fixable=False,
    ),
    "exploding": ScenarioInfo(
        "learning rate far too high: per-layer gradient norms climb until non-finite",
        ("exploding_gradient",),  # the non-finite values that follow fold under it
        view="layer table, alerts",
    ),
    "vanishing": ScenarioInfo(
        "a deep sigmoid stack: the first layers' gradients are 1e-4 to 1e-8 of the last's",
        ("vanishing_gradient",),
        subject="0",
        view="layer table (yellow rows)",
    ),
    "nan-forward": ScenarioInfo(
        "-log(1 - sigmoid(z)) hits log(0) once the score saturates: an inf is born in "
        "a named module's forward",
        ("guard_skipped_update", "non_finite"),
        view="guard pause, then a: anomaly report",
    ),
    "nan-backward": ScenarioInfo(
        "a hand-written norm, sqrt(sum(h**2)), at h = 0: finite forward, NaN gradient "
        "(PowBackward0)",
        ("guard_skipped_update", "non_finite"),
        view="guard pause, then a: anomaly report",
    ),
    "overfit": ScenarioInfo(
        "a big MLP on 48 examples: training loss falls while validation loss rises",
        ("overfitting_signal",),
        view="loss chart (diverging curves), alerts",
    ),
    "flat-loss": ScenarioInfo(
        "labels shuffled: the training loss stays where it started",
        ("flat_loss",),
        view="loss chart, alerts",
    ),
    "dead-relu": ScenarioInfo(
        "a ReLU layer initialised with bias -10: its outputs are all exactly zero",
        ("dead_activations",),
        subject="act1",
        view="layer table (grey row), alerts",
    ),
    "no-zero-grad": ScenarioInfo(
        "optimizer.zero_grad() forgotten: gradients accumulate across steps",
        ("grad_not_cleared",),
        view="alerts, growing grad norms",
    ),
    "eval-mode": ScenarioInfo(
        "validation with dropout on and gradients recorded",
        ("eval_in_train_mode", "eval_with_grad"),
        view="alerts",
    ),
    "none-grad": ScenarioInfo(
        "a branch detached from the loss: its parameters never get a gradient",
        ("none_gradients",),
        subject="aux",
        view="layer table (magenta rows), alerts",
    ),
    "leakage": ScenarioInfo(
        "normalisation statistics fitted on train, validation and test together",
        ("leakage",),
        subject="mean",
        view="checks view (c), alerts",
    ),
    "shape-bug": ScenarioInfo(
        "MSELoss given outputs [B, 1] and targets [B]: it broadcasts to [B, B]",
        ("broadcast_in_loss",),
        subject="targets",
        view="checks view (c), alerts",
    ),
    "lr-too-low": ScenarioInfo(
        "Adam at lr 1e-7: updates are a millionth of the weights, the loss barely moves",
        ("update_ratio",),
        view="layer table (update/w), alerts",
    ),
    "ddp-desync": ScenarioInfo(
        "a 2-rank DDP job that calls the inner module on every other step: those steps "
        "skip the all-reduce and the replicas drift apart while every loss looks fine",
        ("replicas_diverged", "grads_not_synced"),
        view="job view (ranks), alerts",
        either=True,  # whichever the ranks' shown steps reveal first; the other folds
    ),
    "input-bound": ScenarioInfo(
        "the loader takes 8 ms for each batch of a step that computes in about 5: the "
        "loop waits for its data most of the time",
        ("input_bound",),
        view="alerts (the data share of the step)",
    ),
    "retained-graph": ScenarioInfo(
        "the loop sums its losses as tensors (total_loss += loss): every step's autograd "
        "graph stays alive, chained to the total",
        ("retained_graph",),
        view="alerts",
    ),
    "memory-creep": ScenarioInfo(
        "the loop keeps a copy of the weights after every update and never evicts one: "
        "the process's memory grows by 282 KB a step",
        ("memory_creep",),
        view="alerts (the memory and its growth)",
    ),
    "straggler": ScenarioInfo(
        "a 2-rank DDP job whose rank 1 waits 25 ms for each batch: rank 0 waits for it in "
        "every all-reduce",
        ("straggler",),
        subject="rank 1",
        view="job view (ranks), alerts",
    ),
}

#: Scenarios that are jobs of several ranks (``demo.ddp``), not one training loop.
JOB_SCENARIOS = frozenset({"ddp-desync", "straggler"})


NBSP = "\u00a0"


def listing(width: int = 79) -> str:
    """The scenarios for ``--list``: name, what breaks, the alert it raises; each
    description wrapped at word boundaries under its own column to fit ``width``."""
    names = max(len(name) for name in SCENARIOS)
    lines = []
    for name, info in SCENARIOS.items():
        joined = (" or " if info.either else ", ").join(info.alerts)
        alert = f"-> {joined}" if info.alerts else "-> no alert"
        # the arrow and the first alert stay together (a no-break space while wrapping)
        text = f"{info.summary} {alert.replace(' ', NBSP, 1)}"
        wrapped = [
            line.replace(NBSP, " ")
            for line in textwrap.wrap(
                text, width=max(width - names - 2, 20), break_on_hyphens=False
            )
        ]
        lines.append(f"{name:<{names}}  {wrapped[0]}")
        lines += [" " * (names + 2) + more for more in wrapped[1:]]
    return "\n".join(lines)
