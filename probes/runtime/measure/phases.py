"""Where a step's time goes: its phases, from the boundaries the probe already sees.

The clock is a state machine over five marks, each from a hook the probe has anyway or
one call more: the watched model's forward begins (a forward pre-hook where the model is
entered, outside any compiled region: ``probes.runtime.patches.hooks.entry_pre_hook``),
``backward()`` begins and returns (a layer on torch's ``autograd.backward``, one for
every clock), ``optimizer.step()`` begins and returns (the probe's optimizer hooks).
The time between two marks is given to a phase by what was under way:

- **data**: between the end of an update (or of the last backward, between accumulated
  passes) and the next forward, the loop waiting for its batch: the time inside a
  ``DataLoader``'s ``__next__`` (workers to wait for, or samples decoded right there),
  and the rest of that gap where the training thread was blocked (on a queue, a disk, a
  sleep: its wall time less its CPU time and its wait for a core). What the loop
  computes there (an EMA update, mixing a batch, ``zero_grad``) is other;
- **forward**: from a forward's start to the backward that follows (the loss included);
- **backward**: inside ``backward()`` (in DDP, the wait for the other ranks' gradients
  too: the all-reduce runs inside it);
- **optimizer**: inside ``optimizer.step()`` (a closure's forward and backward included);
- the rest (a clip, logging, an evaluation, a backward with no forward seen) is other.

The probe's own time at its boundaries is taken out of the phase it falls in
(``exclude_since``):
the record's ``probe_time`` carries it. ``harvest`` closes the step: its phases, and its
``cycle``, the seconds since the last harvest, which the phases and the probe's time fill.
Only forwards with gradients on and the model in training mode count (an evaluation's
forwards are not the step's), and an evaluation the probe is told of is other.

On the CPU these are wall-clock seconds, as the loop feels them. On CUDA the host's view
would say little (kernels are queued, not waited for): each mark also records an event
(``device``: ``probes.runtime.measure.device_phases``), and the record carries the
device's phases, read a step or more later.

Cost: one ``perf_counter`` and a few assignments a mark, four to six marks a step.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from enum import IntEnum
from time import perf_counter, thread_time
from typing import Any, Protocol

import torch
from torch import nn

from probes.runtime.patches.hooks import EntryHandle, eager, entry_pre_hook
from probes.runtime.patches.patches import Held, Layer
from probes.runtime.patches.seams import BACKWARD, LOADER_NEXT


class Phase(IntEnum):
    """A phase of a step; its value indexes ``PhaseClock.seconds``."""

    DATA = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    OTHER = 4


#: The record's field for each phase's seconds (``probes.kernel.schema.spec``).
PHASE_FIELDS = ("data_time", "forward_time", "backward_time", "optimizer_time")


class DeviceMarks(Protocol):
    """The device's side of the clock (``probes.runtime.measure.device_phases``)."""

    def mark(self, phase: Phase) -> None: ...

    def step_ends(self, into: dict[str, Any]) -> None: ...


class _State(IntEnum):
    """What the time since the clock's last mark is."""

    WAITING = 0  # for the next forward (after an update, or the step's start)
    FORWARD = 1
    BACKWARD = 2
    AFTER_BACKWARD = 3  # until the next forward (data) or the update (other)
    OPTIMIZER = 4
    EVALUATING = 5
    ELSEWHERE = 6  # another watched model computes or updates (a GAN's other player)


# What an interval still open is, when the step closes (``harvest``).
_OPEN_AS = {
    _State.WAITING: Phase.DATA,
    _State.FORWARD: Phase.FORWARD,
    _State.BACKWARD: Phase.BACKWARD,
    _State.AFTER_BACKWARD: Phase.OTHER,
    _State.OPTIMIZER: Phase.OPTIMIZER,
    _State.EVALUATING: Phase.OTHER,
    _State.ELSEWHERE: Phase.OTHER,
}


class PhaseClock:
    """The phases of a watched model's steps (see the module).

    Args:
        module: the watched model, unwrapped (its forward is hooked where it is entered).
        on_error: switches the probe off after an error inside a mark (never raised).
        on_backward: told the tensors each ``backward()`` runs from (``retained``).
    """

    def __init__(
        self,
        module: nn.Module,
        on_error: Callable[[BaseException], None],
        on_backward: Callable[[Any], None] | None = None,
    ) -> None:
        self.seconds = [0.0] * len(Phase)
        self._on_backward = on_backward
        self.device: DeviceMarks | None = None  # set for a model on CUDA (``device_phases``)
        self.samples = 0  # the inputs' leading dimension, summed over the step's forwards
        self._fail = on_error
        self._mark = perf_counter()
        self._harvested = self._mark
        self._state = _State.WAITING
        self._in_update = False
        self._excluded = 0.0  # the probe's own seconds inside the open interval
        self._seen = False  # a forward, backward or update of the step was seen
        # The wait for data, told apart from the loop's own work between steps (an EMA
        # update, mixing a batch, logging): the time inside a DataLoader's ``__next__``,
        # and the rest of the gap where this thread was idle (blocked, not computing).
        self._thread = threading.get_ident()
        self._schedstat: int | None = None
        self.busy = self._busy_clock()
        self._loader_wall = self._loader_cpu = 0.0
        self._cpu_mark = self.busy()
        self._entry: EntryHandle | None = entry_pre_hook(module, eager(self._forward_begins))
        _install(self)

    def _busy_clock(self) -> Callable[[], float]:
        """Seconds this (the training) thread has been running or waiting for a core:
        its wall time less these is the time it sat blocked. Its CPU time, plus on Linux
        its wait on the run queue from ``/proc/thread-self/schedstat`` (one ``pread`` of
        a file bound to this thread). Elsewhere its CPU time alone: a
        thread that waits for a core on a crowded machine then reads as blocked."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            self._schedstat = fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            int(os.pread(fd, 64, 0).split()[1])

            def running_or_runnable() -> float:
                # (its CPU time from the clock, exact; the file's lags up to a tick)
                return thread_time() + int(os.pread(fd, 64, 0).split()[1]) / 1e9

            return running_or_runnable
        return thread_time

    def remove(self) -> None:
        """Take the clock's hooks away (idempotent)."""
        entry, self._entry = self._entry, None
        if entry is not None:
            entry.remove()
        _uninstall(self)
        fd, self._schedstat = self._schedstat, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- the marks ------------------------------------------------------------------------

    def _close(self, phase: Phase) -> None:
        if self.device is not None:  # (CUDA: the device's time between the same marks)
            self.device.mark(phase)
        now = perf_counter()
        spent = now - self._mark - self._excluded
        if spent > 0 and phase is Phase.DATA:
            waited = self._waited(spent)
            self.seconds[Phase.DATA] += waited
            self.seconds[Phase.OTHER] += spent - waited
        elif spent > 0:
            self.seconds[phase] += spent
        self._mark, self._excluded = now, 0.0

    def _waited(self, spent: float) -> float:
        """Of a gap of ``spent`` seconds between steps, the wait for data: the time in a
        DataLoader's ``__next__``, and the rest of the gap this thread was not computing."""
        loader = min(self._loader_wall, spent)
        busy = self.busy() - self._cpu_mark - self._loader_cpu - self._excluded
        self._loader_wall = self._loader_cpu = 0.0
        return loader + max(0.0, spent - loader - max(0.0, busy))

    def _gap_begins(self) -> None:
        """The loop is between steps from here: its wait for data is counted from here."""
        self._cpu_mark = self.busy()
        self._loader_wall = self._loader_cpu = 0.0

    def loaded(self, wall: float, cpu: float) -> None:
        """A DataLoader's ``__next__`` took ``wall`` seconds (``cpu`` of them computing)
        on this clock's thread."""
        self._loader_wall += wall
        self._loader_cpu += cpu

    def _forward_begins(self, module: nn.Module, args: Any) -> None:
        if not (module.training and torch.is_grad_enabled()) or self._entry is None:
            return
        try:
            state = self._state
            if self._in_update:
                self._close(Phase.OPTIMIZER)  # (a closure's forward: the update's)
            elif state is _State.FORWARD:
                self._close(Phase.FORWARD)
            elif state is _State.EVALUATING:
                return
            else:
                self._close(_FORWARD_ENDS[state])
            self._state = _State.FORWARD
            self._seen = True
            _tell_others(self)
            first = args[0] if args else None
            if isinstance(first, torch.Tensor) and first.dim() > 0:
                self.samples += first.shape[0]
        except Exception as exc:
            self._fail(exc)

    def backward_begins(self, tensors: Any = None) -> None:
        """``backward()`` is called from ``tensors``."""
        self._seen = True
        if self._on_backward is not None:
            self._on_backward(tensors)
        if self._in_update:
            self._close(Phase.OPTIMIZER)
        else:
            self._close(Phase.FORWARD if self._state is _State.FORWARD else Phase.OTHER)
        self._state = _State.BACKWARD

    def backward_ends(self) -> None:
        """``backward()`` returned."""
        self._close(Phase.BACKWARD)
        self._state = _State.OPTIMIZER if self._in_update else _State.AFTER_BACKWARD
        self._gap_begins()

    def update_begins(self) -> None:
        """``optimizer.step()`` is called (its pre-hook)."""
        if not self._in_update:
            self._seen = True
            # (still waiting: a closure's update, whose forward is inside it)
            self._close(_UPDATE_ENDS.get(self._state, Phase.OTHER))
            self._in_update = True
            self._state = _State.OPTIMIZER
            _tell_others(self)

    def elsewhere(self) -> None:
        """Another watched model's forward or update begins: the wait for data, if this
        clock was waiting, ends there, and what follows is not this model's."""
        if self._state in (_State.WAITING, _State.AFTER_BACKWARD):
            self._close(Phase.DATA)
            self._state = _State.ELSEWHERE

    def update_ends(self) -> None:
        """``optimizer.step()`` returned (its post-hook)."""
        if self._in_update:
            self._close(Phase.OPTIMIZER)
            self._in_update = False
            self._state = _State.WAITING
            self._gap_begins()

    def evaluation_begins(self) -> None:
        """An evaluation the probe is told of begins: its time is other."""
        self._close(_OPEN_AS[self._state])
        self._state = _State.EVALUATING

    def evaluation_ends(self) -> None:
        if self._state is _State.EVALUATING:
            self._close(Phase.OTHER)
            self._state = _State.WAITING
            self._gap_begins()

    @property
    def phase(self) -> str:
        """The phase under way, by name (``data``, ``forward``, ``backward``, ...)."""
        if self._in_update:
            return "optimizer"
        return _OPEN_AS[self._state].name.lower()

    def exclude_since(self, started: float) -> None:
        """The probe's own work since ``started`` (a ``perf_counter``) is not the run's:
        what of it falls in the open interval is left out of its phase."""
        spent = perf_counter() - max(started, self._mark)
        if spent > 0:
            self._excluded += spent

    def harvest(self, into: dict[str, Any]) -> None:
        """The step's record is made: its phases and ``cycle`` go ``into`` it, and the
        next step's count from here."""
        self._close(_OPEN_AS[self._state])
        now = self._mark
        seconds = self.seconds
        into["cycle"] = now - self._harvested
        if self.device is not None:  # the device's phases, of a step read by now
            self.device.step_ends(into)
        elif self._seen:  # (none seen: a compiled training step; its time cannot be split)
            for field, value in zip(PHASE_FIELDS, seconds, strict=False):
                into[field] = value
        if self.samples:
            into["samples"] = self.samples
        self.seconds = [0.0] * len(Phase)
        self.samples = 0
        self._harvested = now
        self._seen = False
        self._gap_begins()

    def restart(self) -> None:
        """Forget the time since the last harvest (a pause is nobody's phase)."""
        self._mark = self._harvested = perf_counter()
        self.seconds = [0.0] * len(Phase)
        self.samples = 0
        self._excluded = 0.0
        self._seen = False
        self._gap_begins()


# What the interval before a forward was, by the state it was in.
_FORWARD_ENDS = {
    _State.WAITING: Phase.DATA,
    _State.AFTER_BACKWARD: Phase.DATA,  # (the next accumulated batch's wait)
    _State.BACKWARD: Phase.BACKWARD,  # (a forward inside backward: checkpointing)
    _State.OPTIMIZER: Phase.OPTIMIZER,
    _State.ELSEWHERE: Phase.OTHER,
}


# What the interval before an update was, by the state it was in (else other).
_UPDATE_ENDS = {_State.WAITING: Phase.DATA, _State.FORWARD: Phase.FORWARD}


# --- torch's backward, one layer for every clock ------------------------------------------

_lock = threading.Lock()
_clocks: list[weakref.ref[PhaseClock]] = []
_held = Held()


def _backward(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    clocks = [clock for ref in _clocks if (clock := ref()) is not None]
    tensors = args[0] if args else kwargs.get("tensors")
    for clock in clocks:
        _safely(clock, clock.backward_begins, tensors)
    result = proceed(*args, **kwargs)
    for clock in clocks:
        _safely(clock, clock.backward_ends)
    return result


def _loader_next(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A DataLoader's ``__next__``: its time goes to the clocks of the thread waiting."""
    thread = threading.get_ident()
    clocks = [c for ref in _clocks if (c := ref()) is not None and c._thread == thread]
    if not clocks:
        return proceed(*args, **kwargs)
    busy = clocks[0].busy
    started, cpu = perf_counter(), busy()
    try:
        return proceed(*args, **kwargs)
    finally:  # (the last batch's StopIteration waited too)
        wall, cpu = perf_counter() - started, busy() - cpu
        for clock in clocks:
            clock.loaded(wall, cpu)


def _tell_others(clock: PhaseClock) -> None:
    """``clock``'s model computes: every other clock learns it is not theirs."""
    if len(_clocks) > 1:
        for ref in _clocks:
            other = ref()
            if other is not None and other is not clock:
                _safely(other, other.elsewhere)


def _safely(clock: PhaseClock, mark: Callable[..., None], *args: Any) -> None:
    try:
        mark(*args)
    except Exception as exc:  # a clock's failure switches its probe off, never training
        clock._fail(exc)


def _install(clock: PhaseClock) -> None:
    with _lock:
        _clocks[:] = [r for r in _clocks if r() is not None]
        _clocks.append(weakref.ref(clock))
        if not _held:
            # innermost on backward: the autostep's own work there is not backward's
            _held.hold(BACKWARD, Layer("phases", _backward, order=90))
            _held.hold(LOADER_NEXT, Layer("phases", _loader_next))


def _uninstall(clock: PhaseClock) -> None:
    with _lock:
        _clocks[:] = [r for r in _clocks if r() is not None and r() is not clock]
        if not _clocks:
            _held.release()
