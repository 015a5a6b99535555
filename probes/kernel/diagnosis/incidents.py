"""One incident per root cause: which alerts are consequences of which causes.

A consequence found while its cause holds (or at any time after a cause that leaves the
run damaged: an explosion, a non-finite value, uncleared gradients, a structural fault
found when ``watch()`` was called) is not raised as an alert of its own: it is folded
under the cause, which lists it. Consequences that can show up a few steps before their
cause (a loss spike just before the gradient crosses its bound) wait
``consequence_grace_steps`` for one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from probes.kernel.diagnosis.alert import Alert
from probes.kernel.diagnosis.catalog import CHECK_RUNGS


@dataclass(frozen=True)
class Fold:
    """``cause`` explains the consequence (when they share a layer, with ``overlap``;
    when most layers of the consequence are the cause's, with ``within``; for update
    ratios, only on ``side``)."""

    cause: str
    overlap: bool = False
    side: str = ""
    within: bool = False


# Causes that leave the run damaged: their consequences fold under them for the rest of
# the run, even once the cause itself has cleared.
STICKY = frozenset(
    {
        "exploding_gradient",
        "non_finite",
        "grad_not_cleared",
        "params_not_in_optimizer",
        "optimizer_not_for_model",
        "mostly_frozen",
        "guard_skipped_update",
        *CHECK_RUNGS,
    }
)

_DAMAGE = ("exploding_gradient", "non_finite", "grad_not_cleared")
_CONTRACT = (
    "probabilities_into_logit_loss",
    "logits_into_nll_loss",
    "broadcast_in_loss",
    "shape_mismatch",
    "float_targets_for_classification",
    "bce_given_logits",
    "cannot_overfit",
)
_FROZEN = (
    "mostly_frozen",
    "params_not_in_optimizer",
    "optimizer_not_for_model",
    "updates_not_applied",
    "no_updates",
    "skipped_updates",
)

CONSEQUENCES: dict[str, tuple[Fold, ...]] = {
    # optimizer.zero_grad() clears only the optimizer's own parameters
    "grad_not_cleared": (
        Fold("optimizer_not_for_model"),
        Fold("params_not_in_optimizer", overlap=True),
    ),
    "exploding_gradient": (Fold("grad_not_cleared"),),
    "non_finite": (Fold("grad_not_cleared"),),
    "vanishing_gradient": (
        Fold("dead_activations", overlap=True),
        Fold("saturated_activations"),
        Fold("exploding_gradient"),
        Fold("non_finite"),
    ),
    "dead_activations": (Fold("exploding_gradient"), Fold("non_finite")),
    "saturated_activations": (Fold("exploding_gradient"), Fold("non_finite")),
    # float32 weights do not move by 1e-12: vanishing gradients leave them unchanged
    "updates_not_applied": (
        Fold("params_not_in_optimizer", overlap=True),
        Fold("optimizer_not_for_model"),
        Fold("vanishing_gradient", overlap=True),
    ),
    "update_ratio": (
        *(Fold(kind) for kind in _DAMAGE),
        Fold("vanishing_gradient", within=True, side="low"),
        Fold("dead_activations", side="low"),
        Fold("saturated_activations", side="low"),
        Fold("none_gradients", overlap=True, side="low"),
        Fold("params_not_in_optimizer", overlap=True, side="low"),
        Fold("updates_not_applied", overlap=True, side="low"),
        Fold("optimizer_not_for_model"),
        Fold("mostly_frozen", side="low"),
        Fold("no_updates"),
    ),
    "loss_spike": (*(Fold(kind) for kind in _DAMAGE), Fold("skipped_updates")),
    "overfitting_signal": (*(Fold(kind) for kind in _DAMAGE), Fold("eval_in_train_mode")),
    "flat_loss": (
        *(Fold(kind) for kind in (*_DAMAGE, *_CONTRACT, *_FROZEN)),
        Fold("vanishing_gradient"),
        Fold("dead_activations"),
        Fold("saturated_activations"),
        Fold("none_gradients"),
        Fold("update_ratio", side="low"),
    ),
}

# Consequences that may be found a few steps before their cause: they wait for it.
WAIT_FOR_CAUSE = frozenset(
    {
        "loss_spike",
        "overfitting_signal",
        "flat_loss",
        "update_ratio",
        "vanishing_gradient",
        "updates_not_applied",
    }
)


@cache
def depth(kind: str) -> int:
    """How far down a chain of causes a kind can sit (0: never a consequence). Alerts
    found on the same record are settled causes first."""
    folds = CONSEQUENCES.get(kind, ())
    return 1 + max((depth(f.cause) for f in folds if f.cause != kind), default=-1)


def cause_for(alert: Alert, causes: Mapping[str, Alert]) -> Alert | None:
    """The cause (among ``causes``, by kind) that ``alert`` is a consequence of."""
    for fold in CONSEQUENCES.get(alert.kind, ()):
        cause = causes.get(fold.cause)
        if cause is None:
            continue
        if fold.side and alert.evidence.get("side") != fold.side:
            continue
        if fold.overlap and not set(alert.layers) & set(cause.layers):
            continue
        if fold.within and 2 * len(set(alert.layers) & set(cause.layers)) <= len(alert.layers):
            continue
        return cause
    return None


def folded_name(alert: Alert) -> str:
    """How a consequence is listed under its cause: ``kind@step``."""
    return f"{alert.kind}@{alert.step}"
