"""One incident per root cause: which alerts are consequences of which causes (within a
run, and under a job's incidents across its ranks).

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
from probes.kernel.diagnosis.catalog import CHECK_RUNGS, ENTRIES
from probes.kernel.diagnosis.vocabulary import AlertKind as K
from probes.kernel.diagnosis.vocabulary import Evidence, RankSubject


@dataclass(frozen=True)
class Fold:
    """``cause`` explains the consequence (when they share a layer, with ``overlap``;
    when most layers of the consequence are the cause's, with ``within``; for update
    ratios, only on ``side``, or only under a cause on ``cause_side``; with ``follows``,
    only when the cause was found at an earlier step: the root cause first in time,
    whatever the rungs say)."""

    cause: str
    overlap: bool = False
    side: str = ""
    within: bool = False
    follows: bool = False
    cause_side: str = ""


# Each kind's traits are on its catalog entry (``Entry.traits``): the tables below are
# read from them, so a new kind says how it is kept where it is described.


def _having(trait: str) -> frozenset[str]:
    return frozenset(kind for kind, found in ENTRIES.items() if getattr(found.traits, trait))


# Causes that leave the run damaged: their consequences fold under it for the rest of
# the run; the pre-training checks' findings too (they do not heal by training).
STICKY = _having("sticky") | frozenset(CHECK_RUNGS)
# ... except these, once the run has recovered from them (the damage undone: an early
# explosion the optimiser came back from does not explain a spike hundreds of steps on)
RECOVERABLE = _having("recoverable")
# Incidents whose numbers hover about their bound while the cause persists.
HELD = _having("held")
# Probe alerts a run has one of.
SAID_ONCE_A_RUN = _having("said_once")
# Events whose rule says when a new incident begins.
EVENTS = _having("event")

_DAMAGE = (K.EXPLODING_GRADIENT, K.NON_FINITE, K.GRAD_NOT_CLEARED)
_CONTRACT = (
    K.PROBABILITIES_INTO_LOGIT_LOSS,
    K.LOGITS_INTO_NLL_LOSS,
    K.BROADCAST_IN_LOSS,
    K.SHAPE_MISMATCH,
    K.FLOAT_TARGETS_FOR_CLASSIFICATION,
    K.BCE_GIVEN_LOGITS,
    K.CANNOT_OVERFIT,
)
_FROZEN = (
    K.MOSTLY_FROZEN,
    K.PARAMS_NOT_IN_OPTIMIZER,
    K.OPTIMIZER_NOT_FOR_MODEL,
    K.UPDATES_NOT_APPLIED,
    K.NO_UPDATES,
    K.SKIPPED_UPDATES,
)

CONSEQUENCES: dict[str, tuple[Fold, ...]] = {
    # optimizer.zero_grad() clears only the optimizer's own parameters
    K.GRAD_NOT_CLEARED: (
        Fold(K.OPTIMIZER_NOT_FOR_MODEL),
        Fold(K.PARAMS_NOT_IN_OPTIMIZER, overlap=True),
    ),
    K.EXPLODING_GRADIENT: (
        Fold(K.GRAD_NOT_CLEARED),
        Fold(K.GRADS_STILL_SCALED),
        # updates as large as the weights at an earlier step: the learning rate is the
        # cause, the gradients grew from the weights it threw about
        Fold(K.UPDATE_RATIO, cause_side="high", follows=True),
    ),
    K.NON_FINITE: (
        Fold(K.GRAD_NOT_CLEARED),
        # gradients that grew until they overflowed: the explosion came first (on the
        # same step, neither is known to be the other's cause: both stand)
        Fold(K.EXPLODING_GRADIENT, follows=True),
        Fold(K.GRADS_STILL_SCALED, follows=True),  # an update on gradients still scaled
    ),
    # a graph kept across steps is what the memory grows with
    K.MEMORY_CREEP: (Fold(K.RETAINED_GRAPH),),
    K.VANISHING_GRADIENT: (
        Fold(K.DEAD_ACTIVATIONS, overlap=True),
        Fold(K.SATURATED_ACTIVATIONS),
        Fold(K.EXPLODING_GRADIENT),
        Fold(K.NON_FINITE),
        Fold(K.LOSS_DIVERGED, follows=True),  # a loss that jumped and stayed: its consequence
    ),
    K.DEAD_ACTIVATIONS: (Fold(K.EXPLODING_GRADIENT), Fold(K.NON_FINITE)),
    K.SATURATED_ACTIVATIONS: (Fold(K.EXPLODING_GRADIENT), Fold(K.NON_FINITE)),
    # float32 weights do not move by 1e-12: vanishing gradients leave them unchanged
    K.UPDATES_NOT_APPLIED: (
        Fold(K.PARAMS_NOT_IN_OPTIMIZER, overlap=True),
        Fold(K.OPTIMIZER_NOT_FOR_MODEL),
        Fold(K.VANISHING_GRADIENT, overlap=True),
    ),
    K.UPDATE_RATIO: (
        Fold(K.EXPLODING_GRADIENT, follows=True),  # (a rate far too high comes first)
        Fold(K.NON_FINITE),
        Fold(K.GRAD_NOT_CLEARED),
        Fold(K.VANISHING_GRADIENT, within=True, side="low"),
        Fold(K.DEAD_ACTIVATIONS, side="low"),
        Fold(K.SATURATED_ACTIVATIONS, side="low"),
        Fold(K.NONE_GRADIENTS, overlap=True, side="low"),
        Fold(K.PARAMS_NOT_IN_OPTIMIZER, overlap=True, side="low"),
        Fold(K.UPDATES_NOT_APPLIED, overlap=True, side="low"),
        Fold(K.OPTIMIZER_NOT_FOR_MODEL),
        Fold(K.MOSTLY_FROZEN, side="low"),
        Fold(K.NO_UPDATES),
        Fold(K.LR_TOO_LOW_TO_UPDATE, side="low"),
        Fold(K.LOSS_DIVERGED, side="high", follows=True),  # (one incident for a rate far too high)
        Fold(K.GRADS_STILL_SCALED),  # clipped while scaled, then unscaled: tiny updates
    ),
    K.LOSS_SPIKE: (
        *(Fold(kind) for kind in _DAMAGE),
        Fold(K.SKIPPED_UPDATES),
        Fold(K.LOSS_DIVERGED),
    ),
    K.OVERFITTING_SIGNAL: (*(Fold(kind) for kind in _DAMAGE), Fold(K.EVAL_IN_TRAIN_MODE)),
    K.FLAT_LOSS: (
        *(Fold(kind) for kind in (*_DAMAGE, *_CONTRACT, *_FROZEN)),
        Fold(K.VANISHING_GRADIENT),
        Fold(K.DEAD_ACTIVATIONS),
        Fold(K.SATURATED_ACTIVATIONS),
        Fold(K.NONE_GRADIENTS),
        Fold(K.UPDATE_RATIO, side="low"),
        Fold(K.LR_TOO_LOW_TO_UPDATE),
        Fold(K.LOSS_DIVERGED),
        Fold(K.GRADS_STILL_SCALED),
    ),
    # (issue 18's first steps: a divergence after an explosion is the explosion's; the
    # clip cutting every step follows from what makes the gradients large)
    K.LOSS_DIVERGED: (
        *(Fold(kind) for kind in _DAMAGE),
        Fold(K.GRADS_STILL_SCALED),
        Fold(K.UPDATE_RATIO, cause_side="high", follows=True),
    ),
    K.CLIP_ALWAYS_ACTIVE: (
        *(Fold(kind) for kind in _DAMAGE),
        Fold(K.LOSS_DIVERGED),
        Fold(K.GRADS_STILL_SCALED),
        Fold(K.LOSS_REDUCTION_MISMATCH),
    ),
    # SGD's tiny updates on vanishing gradients are that rule's: the rate may be fine
    K.LR_TOO_LOW_TO_UPDATE: (Fold(K.VANISHING_GRADIENT, within=True),),
}

# Consequences that may be found a few steps before their cause: they wait for it.
WAIT_FOR_CAUSE = _having("waits_for_cause")

# What an incident across a job's ranks (``job``) explains when it comes first: a bad
# shard's loss makes the (all-reduced) gradients explode and the loss spike everywhere;
# drifting replicas make the ranks' losses and gradients differ. A rank's alert of one of
# these kinds folds under the job's incident instead of being raised.
JOB_CONSEQUENCES: dict[str, frozenset[str]] = {
    K.RANK_OUTLIER: frozenset(
        {
            K.EXPLODING_GRADIENT,
            K.NON_FINITE,
            K.LOSS_SPIKE,
            K.FLAT_LOSS,
            K.OVERFITTING_SIGNAL,
            K.UPDATE_RATIO,
            K.GUARD_SKIPPED_UPDATE,
            K.SKIPPED_UPDATES,
            K.VANISHING_GRADIENT,
            K.DEAD_ACTIVATIONS,
            K.SATURATED_ACTIVATIONS,
            K.LOSS_DIVERGED,  # a bad shard's loss, far above where the run began
            K.CLIP_ALWAYS_ACTIVE,
        }
    ),
    K.GRADS_NOT_SYNCED: frozenset({K.REPLICAS_DIVERGED, K.LOSS_SPIKE}),
    K.REPLICAS_DIVERGED: frozenset({K.LOSS_SPIKE}),
}

# What a job's incident explains on the rank it names alone (its evidence's ``rank``),
# and only with the evidence given: a straggler whose gap is its wait for data and that
# rank's own ``input_bound`` are one root cause (its input path), the second seen from
# the rank itself; another rank's wait for data, or a straggler slow in its forward, is
# not explained by it.
JOB_RANK_CONSEQUENCES: dict[str, dict[str, Mapping[str, str]]] = {
    K.STRAGGLER: {K.INPUT_BOUND: {Evidence.PHASE: "data"}},
}


def explains_on_rank(incident: Alert, rank: int, alert: Alert) -> bool:
    """Is rank ``rank``'s ``alert`` a consequence of the job's ``incident`` on that rank
    (``JOB_RANK_CONSEQUENCES``)?"""
    needs = JOB_RANK_CONSEQUENCES.get(incident.kind, {}).get(alert.kind)
    if needs is None or incident.evidence.get(Evidence.RANK) != rank:
        return False
    return all(incident.evidence.get(key) == value for key, value in needs.items())


# A job's incident found after a cause rank 0 found for every replica, that the cause
# explains: a rate far too high (or the explosion, the non-finite values it leads to)
# throws each rank's loss and its own gradients about on its own shard, and one rank's
# stands apart from the others' by chance. A rank's inputs stand apart by no fault of
# the training (they are measured before the model): that incident is never folded.
REPLICA_EXPLAINS: dict[str, tuple[Fold, ...]] = {
    K.RANK_OUTLIER: (
        Fold(K.EXPLODING_GRADIENT, follows=True),
        Fold(K.NON_FINITE, follows=True),
        Fold(K.UPDATE_RATIO, cause_side="high", follows=True),
    ),
}


def replica_cause(incident: Alert, causes: Mapping[str, Alert]) -> Alert | None:
    """The cause among rank 0's (``causes``, by kind) that explains a job's ``incident``
    (``REPLICA_EXPLAINS``), no milder than it (folding never lowers ``--fail-on``)."""
    if incident.subject == RankSubject.INPUTS:
        return None
    cause = cause_for(incident, causes, REPLICA_EXPLAINS)
    if cause is None or cause.severity.order < incident.severity.order:
        return None
    return cause


def waits_for_cause(alert: Alert) -> bool:
    """Does ``alert`` wait ``consequence_grace_steps`` for a cause? Not update ratios far
    too high: seen on the first sampled step, there is nothing before them to wait for,
    and what follows (the explosion, the divergence) is theirs."""
    return alert.kind in WAIT_FOR_CAUSE and Evidence.FAR_TOO_HIGH not in alert.evidence


@cache
def depth(kind: str) -> int:
    """How far down a chain of causes a kind can sit (0: never a consequence). Alerts
    found on the same record are settled causes first."""
    # (a fold in time never joins two alerts first seen at one step: left out, it lets
    # two kinds each explain the other, whichever came first)
    folds = [f for f in CONSEQUENCES.get(kind, ()) if not f.follows and f.cause != kind]
    return 1 + max((depth(f.cause) for f in folds), default=-1)


def cause_for(
    alert: Alert,
    causes: Mapping[str, Alert],
    table: Mapping[str, tuple[Fold, ...]] = CONSEQUENCES,
) -> Alert | None:
    """The cause (among ``causes``, by kind) that ``alert`` is a consequence of, by
    ``table``'s folds."""
    for fold in table.get(alert.kind, ()):
        cause = causes.get(fold.cause)
        if cause is None:
            continue
        if fold.side and alert.evidence.get(Evidence.SIDE) != fold.side:
            continue
        if fold.cause_side and cause.evidence.get(Evidence.SIDE) != fold.cause_side:
            continue
        if fold.overlap and not set(alert.layers) & set(cause.layers):
            continue
        if fold.within and 2 * len(set(alert.layers) & set(cause.layers)) <= len(alert.layers):
            continue
        if fold.follows and first_step(cause) >= first_step(alert):
            continue
        return cause
    return None


def first_step(alert: Alert) -> int:
    """The step an alert's condition was first seen at (its evidence's ``first_step`` or
    ``since_step`` where it says so: a record standing for several steps is raised at its
    last)."""
    for name in ("first_step", "since_step"):
        value = alert.evidence.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return min(value, alert.step)
    return alert.step


def folded_name(alert: Alert) -> str:
    """How a consequence is listed under its cause: ``kind@step``."""
    return f"{alert.kind}@{alert.step}"


def lists_kind(cause: Alert, kind: str) -> bool:
    """Does ``cause`` list a consequence of ``kind`` already (``folded_name``)? Each
    kind is listed once, at its first step: the same consequence again (another rank's,
    or after it cleared) is not a new one."""
    return any(name.split("@")[0] == kind for name in cause.folded)
