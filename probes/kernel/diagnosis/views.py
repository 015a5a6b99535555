"""The records as the rules see them (``probes.kernel.schema.views`` parses them) and the recent
past the rules look at.

Time is counted in steps: a record that stands for several steps (``span``) carries
their peaks, and the smoothed loss weighs each record by the steps it stands for.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from probes.kernel.schema.views import EvalView, Record, RunInfo, StepView, as_number

__all__ = [
    "EvalView",
    "RecentPast",
    "Record",
    "RunInfo",
    "StepView",
    "as_number",
    "loss_scale",
    "mean",
    "weighted_mean",
]


#: Loss entries kept (one a record, or one a step of a thinned record that carries them).
MAX_LOSS_ENTRIES = 4096


def mean(values: Sequence[float]) -> float:
    """The mean of finite floats, without the overflow of their sum near float max."""
    count = len(values)
    return math.fsum(v / count for v in values)


@dataclass
class RecentPast:
    """The bounded recent past the rules look at."""

    info: RunInfo
    evals: deque[EvalView] = field(default_factory=lambda: deque(maxlen=256))
    # The run's start, kept for its losses: without its per-layer lists (``_start``)
    first_steps: list[StepView] = field(default_factory=list)
    # (step, loss estimate, steps) of the latest records: the smoothed loss reads them
    # (three numbers a record, not the record: a monitor holds the histories of many runs)
    # A thinned record that carries its steps' losses adds one entry a step: the
    # smoothed loss is then that of the steps, however they were thinned.
    _losses: deque[tuple[int, float | None, int]] = field(
        default_factory=lambda: deque(maxlen=MAX_LOSS_ENTRIES)
    )

    # The least training loss seen (``loss_scale``: a loss that reached zero or below)
    least_loss: float = math.inf
    # A game (a GAN): an optimizer's gradient, made by another player's loss, was
    # thrown away unused. Its losses are players' and do not simply fall.
    adversarial: bool = False

    MIN_RECORDS: ClassVar[int] = 3  # a smoothed loss averages at least this many records

    def add_step(self, view: StepView, keep_first: int) -> None:
        if view.discarded_grads:
            self.adversarial = True
        low = view.loss_min
        if low is not None and low < self.least_loss:
            self.least_loss = low
        if view.step_losses is not None and view.steps > 1:
            self._losses.extend(
                (step, loss if math.isfinite(loss) else None, 1) for step, loss in view.step_losses
            )
        else:
            self._losses.append((view.step, view.loss_estimate, view.steps))
        if len(self.first_steps) < keep_first:
            self.first_steps.append(_start(view))

    def recent_losses(
        self, up_to_step: int, steps: int, after_step: int = -1
    ) -> list[tuple[float, int]]:
        """``(loss, steps it stands for)`` of the records in the last ``steps`` steps at
        or before ``up_to_step`` (and after ``after_step``), finite ones only; the last
        ``MIN_RECORDS`` when those are fewer and cover fewer steps (sparse records
        without spans). A record standing for several steps gives the middle of its
        span's range: steadier than the one batch it shows.

        Read from the newest back, and only as far as needed: the rules ask on every
        record, and a history scanned whole would cost most of the monitor's time."""
        window_start = up_to_step - steps
        gathered: list[tuple[int, float, int]] = []  # newest first
        for step, loss, count in reversed(self._losses):
            if step > up_to_step or loss is None:
                continue
            if step <= after_step or (step <= window_start and len(gathered) >= self.MIN_RECORDS):
                break
            gathered.append((step, loss, count))
        recent = [(loss, count) for step, loss, count in gathered if step > window_start]
        if len(recent) < self.MIN_RECORDS and sum(c for _, c in recent) < steps:
            recent = [(loss, count) for _, loss, count in gathered[: self.MIN_RECORDS]]
        recent.reverse()
        return recent

    def loss_scale(self, reference: float, *compared: float) -> float:
        """The scale a change of the loss at ``reference`` is read against, whatever its
        sign (``loss_scale``; the run's start and least training loss from here)."""
        start = next(
            (s.loss_estimate for s in self.first_steps if s.loss_estimate is not None), None
        )
        return loss_scale(reference, start, min(self.least_loss, reference, *compared))

    def smoothed_loss(self, up_to_step: int, steps: int, after_step: int = -1) -> float | None:
        """The smoothed training loss at a step: ``recent_losses`` weighted by the steps
        each stands for (None when there is none)."""
        return weighted_mean(self.recent_losses(up_to_step, steps, after_step))


#: What a kept start record drops: its per-layer lists.
_DROPPED_AT_START: tuple[tuple[str, object], ...] = (
    ("grad_norms", ()),
    ("grad_norms_max", None),
    ("param_norms", None),
    ("update_ratios", None),
    ("activations", None),
    ("more_layers", {}),
)


def _start(view: StepView) -> StepView:
    """A record of the run's start as kept: its per-layer lists dropped (only its losses
    are read; kept whole, the first records of 1,024 ranks held 130 MB of them). A
    shallow copy with those fields set: ``dataclasses.replace`` runs the whole
    constructor again, 3 to 7% of what a job's first records cost the monitor."""
    kept = copy.copy(view)
    for name, value in _DROPPED_AT_START:
        object.__setattr__(kept, name, value)  # (a frozen view: set once, on the copy)
    return kept


def loss_scale(reference: float, start: float | None, least: float) -> float:
    """The positive scale against which a change of a loss is read, for losses of any sign.

    A loss that has stayed above zero (cross-entropy, a squared error: zero is its floor)
    is read against itself, as a ratio: ``reference``. A loss that reached zero or below
    (``least``: the least seen; a density's NLL, an ELBO, a flow) has no floor at zero:
    its zero moves with the data's units, and a fraction of it flips sign and blows up
    near it (a change of 0.01 at -0.2 read as a rise of -5%, at 0.02 as one of 50%). Its
    scale is then the distance the run travelled from its ``start`` to ``reference``,
    or ``|reference|`` where that is larger (never below the magnitude a ratio reads):
    positive, and the same whatever side of zero the loss is on."""
    if reference > 0 and least > 0:
        return reference
    travelled = abs(reference - start) if start is not None and math.isfinite(start) else 0.0
    return max(abs(reference), travelled)


def weighted_mean(values: Sequence[tuple[float, int]]) -> float | None:
    """The mean of ``(value, weight)`` pairs, None for none."""
    total = sum(weight for _, weight in values)
    if not total:
        return None
    return math.fsum(value * (weight / total) for value, weight in values)
