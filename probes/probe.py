"""``probes.watch``: attach to a model (and optimizer) and report every step.

A step is opened and closed by ``begin_step`` / ``end_step`` (``with probe.step()`` is
built on them, and so are the Hugging Face and Lightning callbacks); gradients are read
once per step, where they are final and not yet clipped: in ``optimizer.step()``'s
pre-hook (after the closure's backward when a closure is passed), before any
``torch.nn.utils.clip_grad_norm_``, or where the caller says (``gradients_final``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes import clip, lifecycle, structure
from probes.anomaly import AnomalyStep, backward_op
from probes.control import Control, ControlState
from probes.evaluation import EvalScope
from probes.guard import guard_alert
from probes.hooks import unwrap, unwrap_optimizer
from probes.job import job_identity, sync_of
from probes.layers import LayerMap, count_parameters, map_layers
from probes.lr_experiment import LrExperiment
from probes.sampled import count_mode_sensitive
from probes.sender import Sender, warn
from probes.stats import Measurement
from probes.step import GuardTrip, StepMeasurer
from probes.wire import TOKEN_ENV, Address, resolve_address

Scalar = float | int | torch.Tensor


class Probe:
    """A handle on a watched training run; see ``watch``.

    Use ``with probe.step():`` around each training step (or ``begin_step`` and
    ``end_step`` from a framework's callbacks), ``probe.log(loss=...)`` for scalars,
    ``with probe.evaluate():`` around validation, and ``close()`` (or use the probe as a
    context manager) at the end. Once made, the probe never raises into training: a
    failure inside it is reported once and the probe switches itself off.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Any | None = None,
        *,
        run: str | None = None,
        address: str | Address | None = None,
        every: int = 1,
        sample_every: int = 20,
        grad_accumulation: bool = False,
        guard: bool = False,
        on_anomaly: str = "pause",
        pause_grace_s: float | None = None,
        queue_size: int = 8192,
        history: int = 1024,
        max_steps_per_s: float | None = None,
        job: str | None = None,
        data_parallel: str | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs an nn.Module, got {type(model).__name__}")
        if every < 1 or sample_every < 1:
            raise ValueError("every and sample_every must be at least 1")
        if on_anomaly not in ("pause", "raise"):
            raise ValueError(f"on_anomaly must be 'pause' or 'raise', got {on_anomaly!r}")
        # The optimizer inside accelerate's or Lightning's wrapper (TypeError otherwise).
        real_optimizer = unwrap_optimizer(optimizer)
        self.model = model
        # Inside torch.compile / DDP wrappers: layer names without their prefixes.
        self.module = unwrap(model)
        self.optimizer = real_optimizer
        self.every = every
        self.sample_every = sample_every
        self.layers: LayerMap = map_layers(self.module)
        self.run_id = uuid.uuid4().hex[:12]
        self.name = run or f"{type(self.module).__name__}-{os.getpid()}"
        self.address = resolve_address(address)
        self.identity = job_identity(job)
        self.data_parallel = data_parallel or sync_of(model, self.identity)
        self._handles: list[RemovableHandle] = []
        self._index = -1
        self._in_step = False
        self._step_started = 0.0
        self._probe_time = 0.0  # the probe's own seconds on the training thread, this step
        self._param_ids = {id(p) for p in self.layers.params}
        self._measurer = StepMeasurer(self.module, self.layers, real_optimizer,
                                      grad_accumulation=grad_accumulation, on_error=self._fail,
                                      sample_every=sample_every)
        self._next_step_scope = _StepScope(self, None)
        self._last: Measurement | None = None
        # Records that must reach the monitor after ``_last`` (an eval of its step).
        self._after_last: list[dict[str, Any]] = []
        self._lr_experiment: LrExperiment | None = None  # watched until the LR moves
        self._eval: EvalScope | None = None
        self._disabled = False
        self._closed = False
        self._grad_accumulation = grad_accumulation
        self._on_anomaly = on_anomaly
        self._anomaly: AnomalyStep | None = None
        self._skipped = False
        self._bad_scalars: set[str] = set()  # names warned about once
        if guard and real_optimizer is None:
            warn("guard=True needs the optimizer: pass it to probes.watch")
        if not self.layers.params:
            warn(f"{self.name}: the model has no trainable parameters; only logged scalars "
                 "will be recorded")
        if real_optimizer is not None:
            self._handles.append(
                real_optimizer.register_step_pre_hook(self._before_optimizer_step))
        self._handles += structure.watch_updates(real_optimizer, self.layers,
                                                 lambda: self._measurer.current, self._fail)
        connected = threading.Event()
        self._control = Control(
            connected=connected,
            send=self._send_now,
            scale_lr=self._scale_lr if real_optimizer is not None else None,
            grace_s=_grace_seconds(pause_grace_s),
            token=os.environ.get(TOKEN_ENV) if not self.address.is_loopback else None,
            run_id=self.run_id,
            guard=guard and real_optimizer is not None,
        )
        self.sender = Sender(
            self.address,
            self._hello(),
            queue_size=queue_size,
            history_capacity=history,
            max_steps_per_s=_steps_per_s(max_steps_per_s, self.identity.rank),
            on_command=self._control.receive,
            connected=connected,
            hello_state=self._control.state.as_dict,
            # Every rank of a job shows the same steps now and then, whatever its speed.
            anchor_every=sample_every * ANCHOR_SAMPLES if self.identity.distributed else 0,
        )
        clip.install()  # frameworks clip through torch's function: read before it
        lifecycle.register(self)
        for alert in structure.watch_time_alerts(self.module, real_optimizer, self.layers):
            self.sender.put({"kind": "alert", "step": 0, "alert": alert.to_dict()})

    # --- public API -----------------------------------------------------------------

    @property
    def step_index(self) -> int:
        """Index of the current (or last) step; -1 before the first."""
        return self._index

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_step(self) -> bool:
        """True between ``begin_step`` and ``end_step``."""
        return self._in_step

    @property
    def evaluating(self) -> bool:
        """True between ``begin_evaluation`` and ``end_evaluation``."""
        return self._eval is not None

    def step(self, index: int | None = None) -> _StepScope:
        """Context manager around one training step (forward, backward, update).

        Args:
            index: the step's index, when resuming from a checkpoint; by default the
                previous index plus one, starting at 0.
        """
        if index is None:
            return self._next_step_scope  # reused: one object less per step
        return _StepScope(self, index)

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

    def log(self, **scalars: Scalar) -> None:
        """Record scalars for the current step, or for the eval inside ``evaluate()``.

        Values may be floats, ints or one-element tensors; tensors are not read here
        (no ``.item()``, no device sync): they travel with the step's batched copy.
        Called after a step's ``with`` block, they attach to that step.
        """
        if self._disabled or self._closed:
            return
        started = time.perf_counter()
        try:
            if self._eval is not None:
                self._log_into(self._eval.tensors, self._eval.floats, scalars)
            elif self._in_step and self._measurer.current is not None:
                step = self._measurer.current
                self._log_into(step.tensor_scalars, step.float_scalars, scalars)
            elif self._last is not None:
                self._log_into(self._last.late_scalars, self._last.float_scalars, scalars)
            elif self._index >= 0:
                self._log_into({}, {}, scalars)  # a step not measured (every > 1): check, drop
            else:
                warn("probe.log() before the first step is ignored; log inside "
                     "`with probe.step():`")
        except Exception as exc:
            self._fail(exc)
        if self._in_step:
            self._probe_time += time.perf_counter() - started

    @contextmanager
    def evaluate(self) -> Iterator[Probe]:
        """Context manager around validation; ``log`` inside it makes an ``eval`` record.

        The record is tied to the current step. The probe also notes whether the
        model's forward passes ran in training mode or with gradient recording on (the
        two controls are orthogonal: ``model.eval()`` and ``torch.inference_mode()``).
        """
        opened = self.begin_evaluation()
        try:
            yield self
        finally:
            if opened:
                self.end_evaluation()

    def begin_evaluation(self) -> bool:
        """An evaluation begins (``evaluate()`` on entry; a framework's validation start).

        Returns:
            False if one is already open (or the probe is off): nothing was begun.
        """
        if self._disabled or self._closed or self._eval is not None:
            return False
        try:
            layers = set(self.layers.names)
            modules = [self.module, *(m for n, m in self.module.named_modules()
                                      if n and n in layers)]
            self._eval = EvalScope(modules, max(self._index, 0))
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    def end_evaluation(self, **scalars: Scalar) -> None:
        """The evaluation ends: log ``scalars`` (its metrics) and send its record."""
        scope, self._eval = self._eval, None
        if scope is None:
            return
        try:
            self._log_into(scope.tensors, scope.floats, scalars)
            self._put_after_step(scope.record())
        except Exception as exc:
            scope.remove_hooks()
            self._fail(exc)

    @property
    def update_skipped(self) -> bool:
        """True when the last step's update was skipped (guard or anomaly step)."""
        return self._skipped

    @property
    def control(self) -> ControlState:
        """Paused, anomaly steps armed, guard: as the monitor sees them."""
        return self._control.state

    def arm_anomaly(self, steps: int = 1) -> None:
        """Run the next ``steps`` steps under anomaly detection (as the ``a`` key does)."""
        self._control.receive({"command": "anomaly", "args": {"count": steps,
                                                               "step_now": False}})

    def event(self, name: str, **fields: Any) -> None:
        """Send a named event (an LR change, a restart, ...) tied to the current step."""
        if self._closed:
            return
        self.sender.put({"kind": "event", "name": name, "step": max(self._index, 0),
                         "time": time.time(), **fields})

    def close(self, error: BaseException | None = None) -> None:
        """Remove every hook, flush what is measured, say bye and stop the sender.

        Args:
            error: the exception that ended the run, if one did (the monitor shows it
                instead of "finished").

        Closing twice is a no-op.
        """
        self._close(lifecycle.end_reason(error))

    def _close(self, reason: str) -> None:
        """``close``, telling the monitor why the run ended ("closed", or the error)."""
        if self._closed:
            return
        self._closed = True
        lifecycle.unregister(self)
        clip.uninstall()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._eval is not None:
            self._eval.remove_hooks()
            self._eval = None
        self._measurer.abandon()  # activation hooks of a step left open
        self._end_anomaly()  # anomaly mode of a step left open
        try:
            self._flush_last()
        finally:
            self.sender.close(reason=reason)

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._close(lifecycle.end_reason(exc))

    def owns(self, param: torch.Tensor) -> bool:
        """True if ``param`` is one of the watched model's trainable parameters."""
        return id(param) in self._param_ids

    # --- step boundary --------------------------------------------------------------

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
            self._anomaly = AnomalyStep(self.module, next_index, on_error=self._fail,
                                        on_caught=self._anomaly_caught,
                                        catch=self._on_anomaly == "pause",
                                        check_nan=not self.identity.distributed)
            self._anomaly.start()
        if next_index % self.every == 0:
            sampled = next_index % self.sample_every == 0
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
        pause = caught and self._on_anomaly == "pause"
        report = anomaly.finish(error, scalars=scalars, paused=pause,
                                raise_on_anomaly=self._on_anomaly == "raise")
        if caught:
            self._skip_update()  # partial sums of the failed backward must not leak on
        if pause:
            self._control.pause("the anomaly step found a non-finite gradient", self._index)
        report["state"] = self._control.state.as_dict()
        self.sender.put(report)
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
        """Keep ``optimizer.step()`` from changing any weight: with no gradients, the
        optimizers of torch.optim skip every parameter (state, weight decay and all),
        as GradScaler's skip does; nothing is raised into the loop."""
        self._skipped = True
        for param in self.layers.params:
            param.grad = None
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    param.grad = None

    def _end_anomaly(self) -> None:
        """Turn off an anomaly step that will not finish normally (close, failure)."""
        anomaly, self._anomaly = self._anomaly, None
        if anomaly is not None:
            anomaly.finish(None, scalars={}, paused=False, raise_on_anomaly=False)

    def _scale_lr(self, factor: float) -> list[float]:
        """Multiply every param group's learning rate (the monitor's LR experiment)."""
        assert self.optimizer is not None
        before, new = [], []
        for group in self.optimizer.param_groups:
            before.append(float(group["lr"]))
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].mul_(factor)
            else:
                group["lr"] = group["lr"] * factor
            new.append(float(group["lr"]))
        # Watched only with plain-float LRs: reading a tensor LR on a device would sync.
        plain = not any(isinstance(g["lr"], torch.Tensor) for g in self.optimizer.param_groups)
        self._lr_experiment = LrExperiment(self._index + 1, factor, before, new) if plain else None
        return new

    def _check_lr_experiment(self, step: int) -> None:
        """Did the loop (a scheduler) set the learning rate back since the experiment?
        Then say so once: the chart's marker would claim a change that did not last."""
        experiment = self._lr_experiment
        assert experiment is not None and self.optimizer is not None
        now = [group["lr"] for group in self.optimizer.param_groups]
        if now == experiment.set_to:
            if step - experiment.step >= LrExperiment.WATCH_STEPS:
                self._lr_experiment = None  # it held: stop looking
            return
        self._lr_experiment = None
        if experiment.undone_by(now):
            alert = experiment.alert(step, now)
            self.sender.put({"kind": "alert", "step": step, "alert": alert.to_dict()})

    def _send_now(self, record: dict[str, Any]) -> None:
        self.sender.put(record)

    # --- the optimizer's step and clipping ---------------------------------------------

    def _before_optimizer_step(self, optimizer: Any, args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
        """The optimizer's step pre-hook. With a closure, the gradients are those the
        closure makes: it is wrapped, and they are read after its backward."""
        if self._in_step and not self._disabled:
            try:
                closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
                if closure is not None:
                    return _with_closure(args, kwargs, self._closure_reading(closure))
                self._gradients_ready()
            except Exception as exc:
                self._fail(exc)
        elif self._last is not None:
            # optimizer.step() after the step's block: it still updates with that step's
            # gradients (the record, not yet sent, must not say the update was skipped).
            self._last.optimizer_step = True
        return None

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
        """Called by ``probes.clip.clip_grad_norm_`` before it clips."""
        if self._in_step and not self._disabled:
            started = time.perf_counter()
            try:
                self._measurer.clipping(max_norm, norm_type)
            except Exception as exc:
                self._fail(exc)
            self._probe_time += time.perf_counter() - started

    def _clipped(self, total_norm: torch.Tensor) -> None:
        """Called by ``probes.clip.clip_grad_norm_`` with torch's total norm."""
        if self._in_step and not self._disabled:
            try:
                self._measurer.clipped(total_norm)
            except Exception as exc:
                self._fail(exc)

    # --- records ----------------------------------------------------------------------

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

    def _log_into(
        self,
        tensors: dict[str, torch.Tensor],
        floats: dict[str, float],
        scalars: dict[str, Scalar],
    ) -> None:
        """File each scalar; a value that is not one number is dropped with one warning
        per name (a mistake in what is logged must not stop the measuring)."""
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                tensors[name] = value.detach()
            elif isinstance(value, int | float) and not isinstance(value, bool):
                floats[name] = float(value)
            elif name not in self._bad_scalars:
                self._bad_scalars.add(name)
                shape = f"a tensor of shape {tuple(value.shape)}" if isinstance(
                    value, torch.Tensor) else type(value).__name__
                warn(f"log({name}=...) takes a float or a one-element tensor, got {shape}; "
                     "that value is not recorded")

    def _fail(self, exc: BaseException) -> None:
        """Switch the probe off after an internal error; training goes on."""
        if self._disabled:
            return
        self._disabled = True
        with contextlib.suppress(Exception):
            self._measurer.abandon()  # no activation hooks or weight copy left behind
        with contextlib.suppress(Exception):
            self._end_anomaly()
        if self._eval is not None:
            with contextlib.suppress(Exception):
                self._eval.remove_hooks()
            self._eval = None
        warn(f"probe switched off after an error: {type(exc).__name__}: {exc}")
        self.sender.put({"kind": "event", "name": "probe_error", "step": max(self._index, 0),
                         "time": time.time(), "message": f"{type(exc).__name__}: {exc}"})

    def _hello(self) -> dict[str, Any]:
        hello: dict[str, Any] = {
            "run": self.run_id,
            "name": self.name,
            "pid": os.getpid(),
            **self.identity.as_hello(),
            "sync": self.data_parallel,
            "torch": torch.__version__,
            "started": time.time(),
            "argv": sys.argv[:8],
            "model": type(self.module).__name__,
            "optimizer": type(self.optimizer).__name__ if self.optimizer else None,
            "layers": list(self.layers.names),
            "param_counts": list(self.layers.param_counts),
            "trainable_params": count_parameters(self.model),
            "params": list(self.layers.param_names),
            "activations": self._measurer.activations.names,
            "mode_sensitive_modules": count_mode_sensitive(self.model),
            "config": {"every": self.every, "sample_every": self.sample_every,
                       "grad_accumulation": self._grad_accumulation,
                       "update_check": self.optimizer is not None},
        }
        token = os.environ.get(TOKEN_ENV)
        if token:
            hello["token"] = token
        return hello


def _with_closure(args: tuple[Any, ...], kwargs: dict[str, Any],
                  closure: Callable[[], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The optimizer step's (args, kwargs) with ``closure`` in place of the caller's."""
    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs


class _StepScope:
    """The ``with probe.step():`` block; a class rather than a generator, for speed."""

    __slots__ = ("_index", "_probe")

    def __init__(self, probe: Probe, index: int | None) -> None:
        self._probe = probe
        self._index = index

    def __enter__(self) -> Probe:
        self._probe.begin_step(self._index)
        return self._probe

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._probe.end_step(exc)


PAUSE_GRACE_ENV = "TRAINTOP_PAUSE_GRACE"
DEFAULT_PAUSE_GRACE_S = 10.0


def _grace_seconds(explicit: float | None) -> float:
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


def _steps_per_s(explicit: float | None, rank: int) -> float:
    if explicit is not None:
        return explicit
    return RANK0_STEPS_PER_S if rank == 0 else OTHER_RANKS_STEPS_PER_S


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Any | None = None,
    *,
    run: str | None = None,
    address: str | Address | None = None,
    every: int = 1,
    sample_every: int = 20,
    grad_accumulation: bool = False,
    guard: bool = False,
    on_anomaly: str = "pause",
    **options: Any,
) -> Probe:
    """Watch a training run: per-step loss, per-layer gradient norms and more.

    Args:
        model: the model being trained.
        optimizer: its optimizer, or a wrapper that holds one (accelerate's, Lightning's);
            gradients are read in ``optimizer.step()`` (after a closure's backward),
            or before a ``torch.nn.utils.clip_grad_norm_``, whichever comes first.
        run: a name for the run in the monitor (default: model class and pid).
        address: the monitor's address (default: ``$TRAINTOP_ADDRESS``, else the
            per-user Unix socket).
        every: measure one step in ``every``.
        sample_every: costlier statistics (parameter norms, update/weight ratios,
            activation health) on one step in this many.
        grad_accumulation: you accumulate gradients over several steps on purpose;
            the check that ``zero_grad`` runs every step is then off.
        guard: keep non-finite gradients from the weights (``optimizer.step()`` then
            changes nothing, as with AMP's GradScaler), raise an alert and pause. Costs
            one host/device sync per step. The monitor's ``g`` key turns it on and off.
        on_anomaly: what an anomaly step (the monitor's ``a`` key) does when it
            catches a non-finite gradient: ``"pause"`` (skip the update, pause the run)
            or ``"raise"`` (re-raise the error into the training loop).
        **options: ``pause_grace_s`` (how long a paused run waits for a monitor that
            went away; default 10, or ``$TRAINTOP_PAUSE_GRACE``), ``queue_size``,
            ``history``, ``max_steps_per_s`` (step records a second sent at most; by
            default 60 on rank 0 and 10 on the other ranks of a job), ``job`` (the
            job's id, shared by its ranks; by default from torchrun, SLURM or the
            rendezvous address), ``data_parallel`` (how the ranks share gradients:
            ``"ddp"`` all-reduced, ``"fsdp"`` sharded; by default from the model's
            wrapper; it decides which cross-rank checks apply).

    Returns:
        A ``Probe``; also a context manager that closes it.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``optimizer`` is neither an
            optimizer nor a wrapper of one.

    Example::

        with probes.watch(model, optimizer) as probe:
            for x, y in loader:
                with probe.step():
                    loss = F.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    probe.log(loss=loss)
    """
    return Probe(model, optimizer, run=run, address=address, every=every,
                 sample_every=sample_every, grad_accumulation=grad_accumulation, guard=guard,
                 on_anomaly=on_anomaly, **options)
