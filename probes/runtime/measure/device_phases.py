"""On CUDA, a step's phases as the device runs them: the host only queues the kernels, so
its own clock says when work was queued, not when it ran, and a host that waits in a sync
(``loss.item()`` after the update) would look like a loop waiting for data.

At each of the phase clock's marks (``probes.runtime.measure.phases``) an event is
recorded on the current stream, from a pool (no allocation a step). The time between two
events is the device's, given to the phase the host attributed that interval to: between
the end of an update and the next forward it is the time the device sat idle waiting for
the host (its data wait: zero while the host runs ahead). A step's events are read once
its last one has completed (``query()``, never a sync): a step or more later, so a
record carries the device phases of the latest step read by then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch

from probes.runtime.measure.phases import PHASE_FIELDS, Phase

_PENDING = 8  # steps whose events may still run on the device (older ones are dropped)
_POOL = 64  # events kept for reuse


class DeviceClock:
    """The device's side of the phase clock (see the module).

    Args:
        make_event: makes one timing event (by default ``torch.cuda.Event(enable_timing=True)``;
            a test gives a stand-in with ``record``, ``query`` and ``elapsed_time``).
    """

    def __init__(self, make_event: Callable[[], Any] | None = None) -> None:
        self._make = make_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._free: list[Any] = []
        self._marks: list[tuple[Phase, Any]] = []  # this step's: (the phase before it, event)
        self._pending: deque[list[tuple[Phase, Any]]] = deque()
        self._read: list[float] | None = None  # the latest step read, seconds by phase
        self._last: Any = None  # the latest event: where the next step's first interval starts

    def mark(self, phase: Phase) -> None:
        """The interval that ends now was ``phase``: an event on the current stream."""
        if not self._marks and self._last is not None:  # (the gap between two steps)
            self._marks.append((Phase.OTHER, self._last))
        event = self._free.pop() if self._free else self._make()
        event.record()
        self._marks.append((phase, event))
        self._last = event

    def step_ends(self, into: dict[str, Any]) -> None:
        """The step's record is made: the device phases of the latest step read go into
        it (none read yet: no phase fields)."""
        if self._marks:
            self._pending.append(self._marks)
            self._marks = []
        while len(self._pending) > _PENDING:
            self._give_back(self._pending.popleft())
        while self._pending and self._pending[0][-1][1].query():
            self._read = self._seconds(self._pending.popleft())
        if self._read is not None:
            for field, value in zip(PHASE_FIELDS, self._read, strict=False):
                into[field] = value

    def _seconds(self, marks: list[tuple[Phase, Any]]) -> list[float]:
        """Seconds by phase between a completed step's consecutive events."""
        seconds = [0.0] * len(Phase)
        for (_, start), (phase, end) in pairwise(marks):
            seconds[phase] += max(start.elapsed_time(end), 0.0) / 1000  # (ms)
        self._give_back(marks)
        return seconds

    def _give_back(self, marks: list[tuple[Phase, Any]]) -> None:
        """A step's events, read or dropped, back to the pool; its last one starts the
        next step's first interval and goes back with that step."""
        for _, event in marks[:-1]:
            if len(self._free) < _POOL:
                self._free.append(event)
