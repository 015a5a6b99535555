"""The step boundary: where a probe's step begins and ends, and where its gradients are
read, whoever owns the loop.

``begin_step`` / ``end_step`` (``with probe.step()`` is built on them, and so are the
framework callbacks) open and close a step: a paused run blocks in ``begin_step``, an
armed anomaly step starts there, and the step's measurement is handed to the sender when
the next one begins (its late ``log`` calls join it). Gradients are read once per step,
where they are final and not yet clipped: in ``optimizer.step()``'s pre-hook (after the
closure's backward when a closure is passed: the closure is wrapped), before any
``torch.nn.utils.clip_grad_norm_`` (``probes.runtime.optimizers.clip``), or where the caller says
(``gradients_final``). The probe's own time on the training thread is counted here.

``StepBoundary`` is one part of the probe's object graph (``probes.runtime.probe`` wires
it): it is handed the measurer, the run's control and the sender, and owns the state of
the step under way; the optimizer's hooks (``probes.runtime.optimizers.optimizer_hooks``) call
``before_optimizer_step``. Nothing in it raises into training: a failure goes to
``on_error``, which switches the probe off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from probes.runtime.anomaly.guard import GuardTrip, guard_alert, skip_update
from probes.runtime.anomaly.step_anomalies import StepAnomalies
from probes.runtime.job import JobIdentity
from probes.runtime.link.control import Control
from probes.runtime.link.sender import Sender, warn
from probes.runtime.live_checks.wiring import WiringWatch
from probes.runtime.measure.layers import LayerMap
from probes.runtime.measure.measurer import StepMeasurer
from probes.runtime.measure.oom import is_out_of_memory
from probes.runtime.measure.resources import StepResources
from probes.runtime.measure.scalars import Scalar, ScalarFiler
from probes.runtime.measure.stats import Measurement
from probes.runtime.optimizers import amp
from probes.runtime.optimizers.lr_experiment import (
    LrExperiment,
    check_experiment,
    scale_learning_rates,
)
from probes.runtime.options import WatchOptions
from probes.runtime.steps.autostep import InferredSteps
from probes.runtime.steps.scope import with_closure
from probes.runtime.steps.unbracketed import UNBRACKETED_UPDATES, unbracketed_alert


class StepBoundary:
    """Begin and end steps, and read gradients where they are final (see the module).

    Args:
        module: the watched model, unwrapped (anomaly steps hook its layers).
        layers: its layers and trainable parameters.
        optimizer: the real optimizer, if any (guard skips, LR experiments).
        options: how the run is watched.
        identity: the run's place in its job (anomaly mode never stops one rank).
        measurer: measures what happens between the boundaries.
        control: the monitor's commands, applied at each step's start.
        sender: where records go, in the order the monitor must see them.
        scalars: files what ``log`` is given.
        resources: the step's time and memory, told where steps begin and end.
        on_error: switches the probe off after an internal error.
    """

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        layers: LayerMap,
        optimizer: torch.optim.Optimizer | None,
        options: WatchOptions,
        identity: JobIdentity,
        measurer: StepMeasurer,
        control: Control,
        sender: Sender,
        scalars: ScalarFiler,
        resources: StepResources,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._module = module
        self._layers = layers
        self._optimizer = optimizer
        self._options = options
        self._identity = identity
        self._measurer = measurer
        self._control = control
        self._sender = sender  # its ``put`` looked up each time (a benchmark counts it)
        self._scalars = scalars
        self._resources = resources
        self._fail = on_error
        self.on_out_of_memory: Callable[[BaseException], None] = _ignore  # (the probe's)
        self.index = -1  # the current (or last) step; -1 before the first
        self.in_step = False
        self.disabled = False  # switched off after an internal error (``switch_off``)
        self.closed = False  # (``close``)
        self.skipped = False  # the last step's update was skipped (guard, anomaly step)
        self._step_started = 0.0
        self._probe_time = 0.0  # the probe's own seconds on the training thread, this step
        self._last: Measurement | None = None
        # Records that must reach the monitor after ``_last`` (an eval of its step).
        self._after_last: list[dict[str, Any]] = []
        self._lr_experiment: LrExperiment | None = None  # watched until the LR moves
        # the anomaly step and the automatic check (``auto``: the sender tells it)
        self.anomalies = StepAnomalies(
            module=module,
            options=options,
            identity=identity,
            measurer=measurer,
            control=control,
            send=self.send_now,
            skip_update=self._skip_update,
            on_caught=self._anomaly_caught,
            on_error=on_error,
        )
        self._unbracketed_updates = 0  # optimizer steps before any probe step
        # the watch-time checks, again on sampled steps when the trainable set changes
        self.wiring = WiringWatch(module, optimizer)
        # steps found in the loop itself while no step API is used (``autostep``)
        real = getattr(optimizer, "optimizers", (optimizer,) if optimizer is not None else ())
        self.inferred = InferredSteps(
            module,
            self,
            measurer,
            layers,
            tuple(real),
            enabled=options.infer_steps,
            on_error=on_error,
        )

    # --- what the probe asks of its step ---------------------------------------------------

    def log(self, scalars: dict[str, Scalar]) -> None:
        """``probe.log`` outside an evaluation: the scalars join the step under way, or
        the step just ended (its record is held until the next begins)."""
        started = time.perf_counter()
        try:
            inferred = self.inferred
            if inferred.implicit and not inferred.backward_seen and self._last is not None:
                # logged after optimizer.step(), where the next inferred step began
                self._scalars.file(self._last.late_scalars, self._last.float_scalars, scalars)
            elif self.in_step and self._measurer.current is not None:
                step = self._measurer.current
                self._scalars.file(step.tensor_scalars, step.float_scalars, scalars)
            elif self._last is not None:
                self._scalars.file(self._last.late_scalars, self._last.float_scalars, scalars)
            elif self.index >= 0:
                self._scalars.file({}, {}, scalars)  # a step not measured (every > 1): drop
            else:
                warn(
                    "probe.log() before the first step is ignored; log inside `with probe.step():`"
                )
        except Exception as exc:
            self._fail(exc)
        if self.in_step:
            self._probe_time += time.perf_counter() - started

    def count_time(self, started: float) -> None:
        """The probe's own time since ``started`` counts in the step under way, if any."""
        if self.in_step:
            self._probe_time += time.perf_counter() - started

    def close(self) -> bool:
        """The probe closes: no step is measured from now on. False if it was closed
        already (then there is nothing more to do)."""
        if self.closed:
            return False
        # a hand-written update's last step ends here, and an evaluation found open
        self.inferred.close()
        self.closed = True
        return True

    def switch_off(self) -> bool:
        """Stop measuring after an internal error: no hook of the step left behind.
        False if it was off already."""
        if self.disabled:
            return False
        self.disabled = True
        with contextlib.suppress(Exception):
            self._measurer.abandon()  # no activation hooks or weight copy left behind
        with contextlib.suppress(Exception):
            self._resources.remove()  # nor the phases' hooks
        with contextlib.suppress(Exception):
            self.anomalies.end()
        return True

    def abandon(self) -> None:
        """The probe closes: drop a step left open (its activation hooks, its anomaly
        mode); what was measured before it is still sent (``flush_last``)."""
        self._measurer.abandon()
        self.anomalies.end()

    def scale_lr(self, factor: float) -> list[float]:
        """Multiply every param group's learning rate (the monitor's LR experiment)."""
        assert self._optimizer is not None
        new, self._lr_experiment = scale_learning_rates(self._optimizer, factor, self.index + 1)
        return new

    def _check_lr_experiment(self, step: int) -> None:
        """Did the loop (a scheduler) set the learning rate back since the experiment?"""
        assert self._lr_experiment is not None and self._optimizer is not None
        self._lr_experiment, alert = check_experiment(self._lr_experiment, self._optimizer, step)
        if alert is not None:
            self._sender.put({"kind": "alert", "step": step, "alert": alert.to_dict()})

    # --- the boundaries -----------------------------------------------------------------

    def begin_step(self, index: int | None = None) -> None:
        """A step begins (``Probe.begin_step`` says what for whom); a paused run blocks."""
        if self.inferred.active:
            self.inferred.explicit_begin()  # the step API takes precedence
        self._begin(index)

    def begin_inferred(self) -> None:
        """An inferred step begins (``probes.runtime.steps.autostep``), after ``optimizer.step()``:
        the last step's record waits for the next backward (a ``log`` after the update
        joins it)."""
        self._begin(None, flush=False)

    def drop_open_step(self) -> None:
        """Drop the inferred step under way, unrecorded (the step API took over)."""
        self._measurer.abandon()
        self.anomalies.end()
        self.in_step = False
        self.index -= 1

    def drop_unsent(self) -> None:
        """Drop the inferred steps not yet sent: the step API counts from 0."""
        self._last, self._after_last, self.index = None, [], -1

    def send_now(self, record: Any) -> None:
        self._sender.put(record)

    def _begin(self, index: int | None, *, flush: bool = True) -> None:
        started = time.perf_counter()
        if self.disabled or self.closed:  # still count steps, so events keep their step
            self.index = self.index + 1 if index is None else index
            return
        if self.in_step:  # a step never ended (a framework's hook skipped): end it
            self.end_step()
        self._step_started = started
        try:  # (one function, not two: this runs every step)
            next_index = self.index + 1 if index is None else index
            self._measurer.index = next_index
            if flush:  # (an inferred step begun after optimizer.step(): at its first backward)
                self.skipped = False
            if self._lr_experiment is not None:
                self._check_lr_experiment(next_index)
            if self._control.busy:  # commands to apply, or paused: may block here
                self._control.boundary(next_index, self.flush_last)
                # A pause is neither the step's time nor the probe's.
                self._step_started = time.perf_counter()
                self._resources.restart()
            if flush and (self._last is not None or self._after_last):
                self.flush_last()
            self.index = next_index
            self.in_step = True
            self.anomalies.begin(next_index)
            if next_index % self._options.every == 0:
                sampled = next_index % self._options.sample_every == 0
                if sampled and next_index > 0:
                    for alert in self.wiring.check(next_index):
                        self._sender.put(
                            {"kind": "alert", "step": next_index, "alert": alert.to_dict()}
                        )
                self._measurer.begin(next_index, time.time(), sampled)
                self._resources.step_begins(next_index, sampled)
        except Exception as exc:
            self._fail(exc)
        self._probe_time = time.perf_counter() - self._step_started
        self._resources.exclude_since(self._step_started)

    def gradients_final(self) -> None:
        """Read the gradients now if not read yet (``Probe.gradients_final``)."""
        if not self.in_step or self.disabled:
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
        """The step ends (``Probe.end_step``): True when ``error`` is the anomaly step's
        own and was dealt with, so a ``with`` block swallows it."""
        if not self.in_step or self.disabled:
            self.in_step = False
            return False
        started = time.perf_counter()
        swallow = False
        try:
            swallow = self.anomalies.finish(error, self.index)
            if error is not None and not swallow:
                if is_out_of_memory(error):
                    self.on_out_of_memory(error)  # before the error leaves the step
                self._measurer.abandon()
            else:
                last = self._measurer.finish()
                if last is not None:
                    now = time.perf_counter()
                    last.duration = now - self._step_started
                    last.probe_time += self._probe_time + (now - started)  # (hooks: theirs)
                    self._resources.step_ends(last.step, last.layer_values)
                    self._last = last
                else:
                    self._resources.step_not_measured()
        except Exception as exc:
            swallow = False  # the probe failed: the step's own error goes on as it came
            self._fail(exc)
        self.in_step = False
        self._resources.exclude_since(started)
        return swallow

    def _anomaly_caught(self, error: BaseException) -> None:
        """The anomaly step's backward failed (caught there, not raised into training):
        keep this step's gradient norms as they stand, then keep the optimizer from
        using the gradients."""
        self.gradients_final()
        self._skip_update()

    def _guard_tripped(self, trip: GuardTrip) -> None:
        self._skip_update()
        alert = guard_alert(trip)
        self._sender.put({"kind": "alert", "step": trip.step, "alert": alert.to_dict()})
        self._control.pause("the guard skipped a non-finite update", self.index)

    def _skip_update(self) -> None:
        """Keep ``optimizer.step()`` from changing any weight (``probes.runtime.anomaly.guard``)."""
        self.skipped = True
        skip_update(self._layers.params, self._optimizer)

    def before_optimizer_step(
        self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, Any] | None:
        """``optimizer.step()`` is about to run (its pre-hook, ``OptimizerHooks``, calls
        this). With a closure, the gradients are those the closure makes: it is wrapped,
        and they are read after its backward; the (args, kwargs) with it are returned."""
        if not self.in_step and self.inferred.active and not self.closed:
            self.inferred.begin_if_idle()  # (a closure's step: its backward is inside)
        if self.in_step and not self.disabled:
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
        elif self.index < 0 and not self.disabled and not self.closed:
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
            self._sender.put({"kind": "alert", "step": 0, "alert": alert.to_dict()})

    def _closure_reading(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure``, then (its first call only: LBFGS calls it again in its line
        search, at other weights) the reading of the gradients it made. Each call's
        gradients are used: the next call's backward must find them cleared."""
        first = True

        def closure_then_read() -> Any:
            nonlocal first
            loss = closure()
            if first:
                first = False
                self.inferred.closure_loss(loss)
                self._gradients_ready()
            self._measurer.clearing.updated()
            return loss

        return closure_then_read

    def _gradients_ready(self) -> None:
        """Gradients are final and ``optimizer.step()`` is next: measure them (and, with
        the guard, keep non-finite ones from the weights). Never raises."""
        if not self.in_step or self.disabled:
            return
        started = time.perf_counter()
        try:
            if amp.any_scaled:  # (a GradScaler at work: else nothing to ask, every step)
                self._note_scaled()
            trip = self._measurer.before_optimizer_step(guard=self._control.state.guard)
            if trip is not None:
                self._guard_tripped(trip)
        except Exception as exc:
            self._fail(exc)
        self._probe_time += time.perf_counter() - started
        self._resources.exclude_since(started)

    def clipping(self, max_norm: float, norm_type: float = 2.0) -> None:
        """``clip_grad_norm_`` (``runtime.optimizers.clip``) is about to clip, via the probe."""
        if self.in_step and not self.disabled:
            started = time.perf_counter()
            try:
                self._measurer.clipping(max_norm, norm_type)
                self._note_scaled()
            except Exception as exc:
                self._fail(exc)
            self._probe_time += time.perf_counter() - started

    def _note_scaled(self) -> None:
        """The gradients read now still carry a GradScaler's scale (``optimizers.amp``:
        clipped or stepped before ``scaler.unscale_``): the record says so."""
        step = self._measurer.current
        if step is not None and step.grads_scaled is None:
            step.grads_scaled = amp.still_scaled(self._optimizer)

    def clipped(self, total_norm: torch.Tensor) -> None:
        """``clip_grad_norm_`` (``runtime.optimizers.clip``) clipped: torch's total norm, unread."""
        if self.in_step and not self.disabled:
            try:
                self._measurer.clipped(total_norm)
            except Exception as exc:
                self._fail(exc)

    # --- records, in the order the monitor must see them ---------------------------------

    def flush_last(self) -> None:
        # the first inferred steps are held back (``autostep``), the others sent
        put = self.inferred.put if self.inferred.holding else self._sender.put
        last, self._last = self._last, None
        if last is not None:
            put(last)
        if self._after_last:  # rare (an eval): no new list on every step
            held, self._after_last = self._after_last, []
            for record in held:
                put(record)

    def put_after_step(self, record: dict[str, Any]) -> None:
        """Send ``record`` after the step record it follows: that record is held until
        the next step begins (late ``log`` calls join it), and the monitor must judge
        the step before an eval of the same step (a NaN is the step's, not the eval's)."""
        if self._last is not None or self.in_step:  # (an evaluate() inside the step)
            self._after_last.append(record)
        else:
            self._sender.put(record)


def _ignore(error: BaseException) -> None:
    """No one to tell."""
