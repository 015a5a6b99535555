"""The step boundary: where a probe's step begins and ends, and where its gradients are
read, whoever owns the loop.

``begin_step`` / ``end_step`` (``with probe.step()`` is built on them, and so are the
framework callbacks) open and close a step: a paused run blocks in ``begin_step``, an
armed anomaly step starts there, and the step's measurement is handed to the sender when
the next one begins (its late ``log`` calls join it). Gradients are read once per step,
where they are final and not yet clipped: in ``optimizer.step()``'s pre-hook (after the
closure's backward when a closure is passed: the closure is wrapped), before any
``torch.nn.utils.clip_grad_norm_`` (``probes.runtime.clip``), or where the caller says
(``gradients_final``). The probe's own time on the training thread is counted here.

``StepBoundary`` is a part of ``Probe`` (a mixin: it works on the probe's own state,
declared below); nothing in it raises into training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from probes.runtime.anomaly import AnomalyStep, backward_op
from probes.runtime.control import Control
from probes.runtime.guard import GuardTrip, guard_alert, skip_update
from probes.runtime.job import JobIdentity
from probes.runtime.layers import LayerMap
from probes.runtime.lr_experiment import LrExperiment
from probes.runtime.measurer import StepMeasurer
from probes.runtime.options import WatchOptions
from probes.runtime.sender import Sender, warn
from probes.runtime.stats import Measurement
from probes.runtime.unbracketed import UNBRACKETED_UPDATES, unbracketed_alert


class StepBoundary:
    """Begin and end steps, and read gradients where they are final (see the module)."""

    # The probe's state this part works on (set in ``Probe.__init__``).
    module: torch.nn.Module
    layers: LayerMap
    optimizer: torch.optim.Optimizer | None
    options: WatchOptions
    identity: JobIdentity
    sender: Sender
    _control: Control
    _measurer: StepMeasurer
    _index: int
    _in_step: bool
    _step_started: float
    _probe_time: float
    _last: Measurement | None
    _after_last: list[dict[str, Any]]
    _anomaly: AnomalyStep | None
    _skipped: bool
    _disabled: bool
    _closed: bool
    _lr_experiment: LrExperiment | None
    _unbracketed_updates: int

    def _fail(self, exc: BaseException) -> None:
        raise NotImplementedError  # the probe's

    def _check_lr_experiment(self, step: int) -> None:
        raise NotImplementedError  # the probe's

    def begin_step(self, index: int | None = None) -> None:
        """A training step begins (what ``with probe.step():`` does on entry).

        For loops the caller does not own: a framework callback calls this at the start
        of each optimizer step (its first micro-batch under gradient accumulation). A
        paused run blocks here until the monitor resumes or steps it.

        Args:
            index: the step's index (e.g. the framework's global step); by default the
                previous index plus one, starting at 0.
        """
        started = time.perf_counter()
        if self._disabled or self._closed:  # still count steps, so events keep their step
            self._index = self._index + 1 if index is None else index
            return
        if self._in_step:  # a step never ended (a framework's hook skipped): end it
            self.end_step()
        self._step_started = started
        try:
            self._enter_step(index)
        except Exception as exc:
            self._fail(exc)
        self._probe_time = time.perf_counter() - self._step_started

    def gradients_final(self) -> None:
        """The gradients of this step are final: read them now, if not read yet.

        Needed only where nothing else tells: the optimizer's step and torch's
        ``clip_grad_norm_`` already do. A framework calls it before it clips by other
        means, or before it clears the gradients of a step with no optimizer watched.
        """
        if not self._in_step or self._disabled:
            return
        started = time.perf_counter()
        try:
            step = self._measurer.current
            if step is not None and not step.grads_read:
                self._measurer.read_grads(step)
        except Exception as exc:
            self._fail(exc)
        self._probe_time += time.perf_counter() - started

    def end_step(self, error: BaseException | None = None) -> bool:
        """The step ends (what ``with probe.step():`` does on exit).

        Args:
            error: the exception that ended the step, if one did.

        Returns:
            True when ``error`` is the anomaly step's own and the probe dealt with it (the
            update was skipped, the run pauses): a ``with`` block swallows it then.
        """
        if not self._in_step or self._disabled:
            self._in_step = False
            return False
        started = time.perf_counter()
        swallow = False
        try:
            swallow = self._exit_step(error, started)
        except Exception as exc:
            self._fail(exc)
        self._in_step = False
        return swallow

    def _enter_step(self, index: int | None) -> None:
        next_index = self._index + 1 if index is None else index
        self._measurer.index = next_index
        self._skipped = False
        if self._lr_experiment is not None:
            self._check_lr_experiment(next_index)
        if self._control.busy:  # commands to apply, or paused: may block here
            self._control.boundary(next_index, self._flush_last)
            # A pause is neither the step's time nor the probe's.
            self._step_started = time.perf_counter()
        self._flush_last()
        self._index = next_index
        self._in_step = True
        if self._control.state.anomaly_armed and self._control.take_anomaly_step():
            # In a multi-rank job a backward stopped on one rank would leave the others
            # waiting in DDP's all-reduce: anomaly mode then only records, never stops.
            self._anomaly = AnomalyStep(
                self.module,
                next_index,
                on_error=self._fail,
                on_caught=self._anomaly_caught,
                catch=self.options.on_anomaly == "pause",
                check_nan=not self.identity.distributed,
            )
            self._anomaly.start()
        if next_index % self.options.every == 0:
            sampled = next_index % self.options.sample_every == 0
            self._measurer.begin(next_index, time.time(), sampled)

    def _exit_step(self, error: BaseException | None, started: float) -> bool:
        """End the step; True to swallow ``error`` (the anomaly step's own)."""
        swallow = False
        if self._anomaly is not None:
            swallow = self._finish_anomaly(error)
        if error is not None and not swallow:
            self._measurer.abandon()
            return False
        last = self._measurer.finish()
        if last is not None:
            now = time.perf_counter()
            last.duration = now - self._step_started
            last.probe_time += self._probe_time + (now - started)  # (hooks added theirs)
            self._last = last
        return swallow

    def _finish_anomaly(self, error: BaseException | None) -> bool:
        anomaly, self._anomaly = self._anomaly, None
        assert anomaly is not None
        step = self._measurer.current
        scalars = dict(step.float_scalars) if step is not None else {}
        error = error if error is not None else anomaly.caught
        caught = backward_op(error) is not None
        pause = caught and self.options.on_anomaly == "pause"
        report = anomaly.finish(
            error,
            scalars=scalars,
            paused=pause,
            raise_on_anomaly=self.options.on_anomaly == "raise",
        )
        if caught:
            self._skip_update()  # partial sums of the failed backward must not leak on
        if pause:
            self._control.pause("the anomaly step found a non-finite gradient", self._index)
        report["state"] = self._control.state.as_dict()
        self.sender.put(dict(report))
        return pause

    def _anomaly_caught(self, error: BaseException) -> None:
        """The anomaly step's backward failed (caught there, not raised into training):
        keep this step's gradient norms as they stand, then keep the optimizer from
        using the gradients."""
        self.gradients_final()
        self._skip_update()

    def _guard_tripped(self, trip: GuardTrip) -> None:
        self._skip_update()
        alert = guard_alert(trip)
        self.sender.put({"kind": "alert", "step": trip.step, "alert": alert.to_dict()})
        self._control.pause("the guard skipped a non-finite update", self._index)

    def _skip_update(self) -> None:
        """Keep ``optimizer.step()`` from changing any weight (``probes.runtime.guard``)."""
        self._skipped = True
        skip_update(self.layers.params, self.optimizer)

    def _end_anomaly(self) -> None:
        """Turn off an anomaly step that will not finish normally (close, failure)."""
        anomaly, self._anomaly = self._anomaly, None
        if anomaly is not None:
            anomaly.finish(None, scalars={}, paused=False, raise_on_anomaly=False)

    def _before_optimizer_step(
        self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, Any] | None:
        """The optimizer's step pre-hook. With a closure, the gradients are those the
        closure makes: it is wrapped, and they are read after its backward."""
        if self._in_step and not self._disabled:
            try:
                closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
                if closure is not None:
                    return with_closure(args, kwargs, self._closure_reading(closure))
                self._gradients_ready()
            except Exception as exc:
                self._fail(exc)
        elif self._last is not None:
            # optimizer.step() after the step's block: it still updates with that step's
            # gradients (the record, not yet sent, must not say the update was skipped).
            self._last.optimizer_step = True
        elif self._index < 0 and not self._disabled and not self._closed:
            try:
                self._note_unbracketed_update()
            except Exception as exc:
                self._fail(exc)
        return None

    def _note_unbracketed_update(self) -> None:
        """An update before any probe step: say once, after a few, that none is measured."""
        self._unbracketed_updates += 1
        if self._unbracketed_updates == UNBRACKETED_UPDATES:
            alert = unbracketed_alert(self._unbracketed_updates)
            warn(alert.signal)
            self.sender.put({"kind": "alert", "step": 0, "alert": alert.to_dict()})

    def _closure_reading(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure``, then (its first call only: LBFGS calls it again in its line
        search, at other weights) the reading of the gradients it made."""
        first = True

        def closure_then_read() -> Any:
            nonlocal first
            loss = closure()
            if first:
                first = False
                self._gradients_ready()
            return loss

        return closure_then_read

    def _gradients_ready(self) -> None:
        """Gradients are final and ``optimizer.step()`` is next: measure them (and, with
        the guard, keep non-finite ones from the weights). Never raises."""
        if not self._in_step or self._disabled:
            return
        started = time.perf_counter()
        try:
            trip = self._measurer.before_optimizer_step(guard=self._control.state.guard)
            if trip is not None:
                self._guard_tripped(trip)
        except Exception as exc:
            self._fail(exc)
        self._probe_time += time.perf_counter() - started

    def _clipping(self, max_norm: float, norm_type: float = 2.0) -> None:
        """Called by ``probes.runtime.clip.clip_grad_norm_`` before it clips."""
        if self._in_step and not self._disabled:
            started = time.perf_counter()
            try:
                self._measurer.clipping(max_norm, norm_type)
            except Exception as exc:
                self._fail(exc)
            self._probe_time += time.perf_counter() - started

    def _clipped(self, total_norm: torch.Tensor) -> None:
        """Called by ``probes.runtime.clip.clip_grad_norm_`` with torch's total norm."""
        if self._in_step and not self._disabled:
            try:
                self._measurer.clipped(total_norm)
            except Exception as exc:
                self._fail(exc)

    # --- records, in the order the monitor must see them ---------------------------------

    def _flush_last(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            self.sender.put(last)
        if self._after_last:  # rare (an eval): no new list on every step
            held, self._after_last = self._after_last, []
            for record in held:
                self.sender.put(record)

    def _put_after_step(self, record: dict[str, Any]) -> None:
        """Send ``record`` after the step record it follows: that record is held until
        the next step begins (late ``log`` calls join it), and the monitor must judge
        the step before an eval of the same step (a NaN is the step's, not the eval's)."""
        if self._last is not None or self._in_step:  # (an evaluate() inside the step)
            self._after_last.append(record)
        else:
            self.sender.put(record)


def with_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], closure: Callable[[], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The optimizer step's (args, kwargs) with ``closure`` in place of the caller's."""
    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs


class StepScope:
    """The ``with probe.step():`` block; a class rather than a generator, for speed."""

    __slots__ = ("_index", "_probe")

    def __init__(self, probe: StepBoundary, index: int | None) -> None:
        self._probe = probe
        self._index = index

    def __enter__(self) -> Any:  # the probe
        self._probe.begin_step(self._index)
        return self._probe

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._probe.end_step(exc)
