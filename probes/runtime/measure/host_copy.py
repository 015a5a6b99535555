"""A step's numbers on their way to the host: on the CPU nothing to do; on CUDA one
stacked, non-blocking copy into pinned memory reused from a small ring, and an event
that says when it has landed (the sender reads them then, never the training thread).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

import torch


class HostRing:
    """Pinned host buffers and CUDA events, reused: a step's copy to the host takes a
    free pair of its size, and the sender gives it back once it has read the values
    (``Measurement._values``), so no step pays to pin memory or make an event. Taking
    never waits: with no free pair of that size a new one is made (and kept, up to
    ``slots`` per size; a measurement dropped unread keeps its own).

    Args:
        slots: pairs kept per (size, dtype).
        pin_memory: pin the host buffers (True where CUDA copies into them).
        make_event: how an event is made (``torch.cuda.Event``; a test's stand-in).
    """

    def __init__(
        self,
        slots: int = 8,
        *,
        pin_memory: bool = True,
        make_event: Callable[[], Any] | None = None,
    ) -> None:
        self.slots = slots
        self._pin = pin_memory
        self._make_event = make_event or torch.cuda.Event
        # free pairs by (size, dtype); a deque's append and pop need no lock between
        # the training thread (take) and the sender's (give_back)
        self._free: dict[tuple[int, torch.dtype], deque[tuple[torch.Tensor, Any]]] = {}
        self.made = 0  # pairs made so far (a test, a benchmark)

    def take(self, size: int, dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
        """A free (host buffer, event) pair of ``size`` values of ``dtype``."""
        free = self._free.get((size, dtype))
        if free:
            with contextlib.suppress(IndexError):  # (the last taken meanwhile)
                return free.pop()
        self.made += 1
        host = torch.empty(size, dtype=dtype, pin_memory=self._pin)
        return host, self._make_event()

    def give_back(self, host: torch.Tensor, event: Any) -> None:
        """``host`` has been read (its copy landed): the pair may be taken again."""
        free = self._free.setdefault((host.numel(), host.dtype), deque())
        if len(free) < self.slots:
            free.append((host, event))


def to_host(
    values: list[torch.Tensor], ring: HostRing | None = None
) -> tuple[torch.Tensor | list[torch.Tensor], torch.cuda.Event | None]:
    """Start moving a step's 0-d tensors to host memory; return them and an event.

    On the CPU they are already there: the list itself is returned (stacking would
    cost the training thread a kernel; the sender reads them one by one). On CUDA
    they are stacked and copied to pinned memory without blocking, into a buffer of
    ``ring`` when given (the caller gives it back once read), and the event tells when
    the copy has landed. Other devices: stacked, read later (blocking) by the sender
    thread.
    """
    first = values[0]
    if first.is_cpu:
        return values, None
    vector = torch.stack(values)
    if first.is_cuda:
        if ring is not None:
            host, event = ring.take(vector.numel(), vector.dtype)
        else:
            host = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
            event = torch.cuda.Event()
        host.copy_(vector, non_blocking=True)
        event.record()
        return host, event
    return vector, None
