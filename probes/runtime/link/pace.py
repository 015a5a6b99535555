"""How a probe paces itself: how long a paused run waits for a monitor gone away, how
many step records a second it sends (rank 0 and the others)."""

from __future__ import annotations

import os

PAUSE_GRACE_ENV = "TRAINTOP_PAUSE_GRACE"
DEFAULT_PAUSE_GRACE_S = 10.0


def grace_seconds(explicit: float | None) -> float:
    """The pause's grace: the option, else ``$TRAINTOP_PAUSE_GRACE``, else 10 s."""
    if explicit is not None:
        return explicit
    try:
        return float(os.environ.get(PAUSE_GRACE_ENV, DEFAULT_PAUSE_GRACE_S))
    except ValueError:
        return DEFAULT_PAUSE_GRACE_S


#: Step records a second a rank sends at most, rank 0 and the others: the others' matter
#: for cross-rank checks (their sampled steps are kept) more than for their curves, and
#: one monitor takes the records of many ranks.
RANK0_STEPS_PER_S = 60.0
ANCHOR_SAMPLES = 5  # a job's ranks each show one sampled step in this many, unmerged
OTHER_RANKS_STEPS_PER_S = 10.0


def steps_per_s(explicit: float | None, rank: int) -> float:
    """Step records a second at most: the option, else by rank."""
    if explicit is not None:
        return explicit
    return RANK0_STEPS_PER_S if rank == 0 else OTHER_RANKS_STEPS_PER_S
