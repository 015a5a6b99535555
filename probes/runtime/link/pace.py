"""How a probe paces itself: how long a paused run waits for a monitor gone away, how
many step records a second it sends (rank 0 and the others)."""

from __future__ import annotations

import os
import threading
from typing import Any

from probes.kernel.schema import HelloRecord
from probes.kernel.wire import TOKEN_ENV
from probes.runtime.job import JobIdentity
from probes.runtime.link.control import Control
from probes.runtime.link.sender import Sender
from probes.runtime.options import WatchOptions

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


def paced_sender(
    address: Any,
    hello: HelloRecord,
    options: WatchOptions,
    identity: JobIdentity,
    control: Control,
    connected: threading.Event,
) -> Sender:
    """The run's sender thread, paced as its options and its rank say, its commands to
    ``control``; ``connected`` set while a monitor is."""
    return Sender(
        address,
        hello,
        queue_size=options.queue_size,
        history_capacity=options.history,
        max_steps_per_s=steps_per_s(options.max_steps_per_s, identity.rank),
        on_command=control.receive,
        connected=connected,
        hello_state=control.state.as_dict,
        # Every rank of a job shows the same steps now and then, whatever its speed.
        anchor_every=options.sample_every * ANCHOR_SAMPLES if identity.distributed else 0,
        token=os.environ.get(TOKEN_ENV),
    )
