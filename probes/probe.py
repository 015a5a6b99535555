"""``probes.watch``: attach to a model (and optimizer) and report every step."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes import structure
from probes.anomaly import AnomalyStep, backward_op
from probes.control import Control, ControlState
from probes.diagnosis import Alert
from probes.hooks import eager, unwrap
from probes.layers import LayerMap, count_parameters, map_layers
from probes.sampled import count_mode_sensitive
from probes.sender import Sender, warn
from probes.stats import Measurement
from probes.step import NonFiniteGradients, StepMeasurer
from probes.wire import TOKEN_ENV, Address, resolve_address

Scalar = float | int | torch.Tensor


class Probe:
    """A handle on a watched training run; see ``watch``.

    Use ``with probe.step():`` around each training step, ``probe.log(loss=...)`` for
    scalars, ``with probe.evaluate():`` around validation, and ``close()`` (or use the
    probe as a context manager) at the end. A failure inside the probe never reaches
    the training loop: it is reported once and the probe switches itself off.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
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
        max_steps_per_s: float = 60.0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs an nn.Module, got {type(model).__name__}")
        if every < 1 or sample_every < 1:
            raise ValueError("every and sample_every must be at least 1")
        if on_anomaly not in ("pause", "raise"):
            raise ValueError(f"on_anomaly must be 'pause' or 'raise', got {on_anomaly!r}")
        self.model = model
        # Inside torch.compile / DDP wrappers: layer names without their prefixes.
        self.module = unwrap(model)
        self.optimizer = optimizer
        self.every = every
        self.sample_every = sample_every
        self.layers: LayerMap = map_layers(self.module)
        self.run_id = uuid.uuid4().hex[:12]
        self.name = run or f"{type(self.module).__name__}-{os.getpid()}"
        self.address = resolve_address(address)
        self._handles: list[RemovableHandle] = []
        self._index = -1
        self._in_step = False
        self._step_started = 0.0
        self._param_ids = {id(p) for p in self.layers.params}
        self._measurer = StepMeasurer(self.module, self.layers, optimizer,
                                      grad_accumulation=grad_accumulation, on_error=self._fail,
                                      sample_every=sample_every)
        self._next_step_scope = _StepScope(self, None)
        self._last: Measurement | None = None
        # Records that must reach the monitor after ``_last`` (an eval of its step).
        self._after_last: list[dict[str, Any]] = []
        self._lr_experiment: LrExperiment | None = None  # watched until the LR moves
        self._eval: _EvalScope | None = None
        self._disabled = False
        self._closed = False
        self._grad_accumulation = grad_accumulation
        self._on_anomaly = on_anomaly
        self._anomaly: AnomalyStep | None = None
        self._skipped = False
        self._bad_scalars: set[str] = set()  # names warned about once
        if guard and optimizer is None:
            warn("guard=True needs the optimizer: pass it to probes.watch")
        if not self.layers.params:
            warn(f"{self.name}: the model has no trainable parameters; only logged scalars "
                 "will be recorded")
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
        self._handles += structure.watch_updates(optimizer, self.layers,
                                                 lambda: self._measurer.current, self._fail)
        connected = threading.Event()
        self._control = Control(
            connected=connected,
            send=self._send_now,
            scale_lr=self._scale_lr if optimizer is not None else None,
            grace_s=_grace_seconds(pause_grace_s),
            token=os.environ.get(TOKEN_ENV) if not self.address.is_loopback else None,
            run_id=self.run_id,
            guard=guard and optimizer is not None,
        )
        self.sender = Sender(
            self.address,
            self._hello(),
            queue_size=queue_size,
            history_capacity=history,
            max_steps_per_s=max_steps_per_s,
            on_command=self._control.receive,
            connected=connected,
            hello_state=self._control.state.as_dict,
        )
        for alert in structure.watch_time_alerts(self.module, optimizer, self.layers):
            self.sender.put({"kind": "alert", "step": 0, "alert": alert.to_dict()})
        _open_probes.add(self)

    # --- public API -----------------------------------------------------------------

    @property
    def step_index(self) -> int:
        """Index of the current (or last) step; -1 before the first."""
        return self._index

    @property
    def closed(self) -> bool:
        return self._closed

    def step(self, index: int | None = None) -> _StepScope:
        """Context manager around one training step (forward, backward, update).

        Args:
            index: the step's index, when resuming from a checkpoint; by default the
                previous index plus one, starting at 0.
        """
        if index is None:
            return self._next_step_scope  # reused: one object less per step
        return _StepScope(self, index)

    def log(self, **scalars: Scalar) -> None:
        """Record scalars for the current step, or for the eval inside ``evaluate()``.

        Values may be floats, ints or one-element tensors; tensors are not read here
        (no ``.item()``, no device sync): they travel with the step's batched copy.
        Called after a step's ``with`` block, they attach to that step.
        """
        if self._disabled or self._closed:
            return
        try:
            if self._eval is not None:
                self._eval.log(scalars)
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

    @contextmanager
    def evaluate(self) -> Iterator[Probe]:
        """Context manager around validation; ``log`` inside it makes an ``eval`` record.

        The record is tied to the current step. The probe also notes whether the
        model's forward ran in training mode or with gradient recording on (the two
        controls are orthogonal: ``model.eval()`` and ``torch.inference_mode()``).
        """
        if self._disabled or self._closed or self._eval is not None:
            yield self
            return
        scope = _EvalScope(self)
        self._eval = scope
        try:
            yield self
        finally:
            self._eval = None
            scope.finish()

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

    def close(self) -> None:
        """Remove every hook, flush what is measured, say bye and stop the sender.

        Closing twice is a no-op.
        """
        self._close("closed")

    def _close(self, reason: str) -> None:
        """``close``, telling the monitor why the run ended ("closed", or the error)."""
        if self._closed:
            return
        self._closed = True
        _open_probes.discard(self)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
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
        self._close(end_reason(exc))

    # --- step boundary --------------------------------------------------------------

    def _enter_step(self, index: int | None) -> None:
        next_index = self._index + 1 if index is None else index
        self._measurer.index = next_index
        if self._lr_experiment is not None:
            self._check_lr_experiment(next_index)
        if self._control.busy:  # commands to apply, or paused: may block here
            self._control.boundary(next_index, self._flush_last)
        self._flush_last()
        self._index = next_index
        self._in_step = True
        if self._control.state.anomaly_armed and self._control.take_anomaly_step():
            self._anomaly = AnomalyStep(self.module, next_index, on_error=self._fail)
            self._anomaly.start()
        if next_index % self.every == 0:
            sampled = next_index % self.sample_every == 0
            self._measurer.begin(next_index, time.time(), sampled)
        self._step_started = time.perf_counter()

    def _exit_step(self, error: BaseException | None) -> bool:
        """End the step; True to swallow ``error`` (an anomaly or the guard stopped the
        update: the loop goes on with the next step, the weights untouched)."""
        duration = time.perf_counter() - self._step_started
        self._in_step = False
        swallow = False
        self._skipped = False
        if self._anomaly is not None:
            swallow = self._finish_anomaly(error)
        if isinstance(error, NonFiniteGradients):
            self._guard_tripped(error)
            swallow = True
        self._skipped = swallow
        if error is not None and not isinstance(error, NonFiniteGradients):
            self._measurer.abandon()
        else:
            self._last = self._measurer.finish(duration)
        return swallow

    def _finish_anomaly(self, error: BaseException | None) -> bool:
        anomaly, self._anomaly = self._anomaly, None
        assert anomaly is not None
        step = self._measurer.current
        scalars = dict(step.float_scalars) if step is not None else {}
        caught = backward_op(error) is not None
        pause = caught and self._on_anomaly == "pause"
        report = anomaly.finish(error, scalars=scalars, paused=pause,
                                raise_on_anomaly=self._on_anomaly == "raise")
        if caught:
            self._clear_grads()  # partial sums of the failed backward must not leak on
        if pause:
            self._control.pause("the anomaly step found a non-finite gradient", self._index)
        report["state"] = self._control.state.as_dict()
        self.sender.put(report)
        return pause

    def _guard_tripped(self, error: NonFiniteGradients) -> None:
        self._clear_grads()
        alert = guard_alert(error)
        self.sender.put({"kind": "alert", "step": error.step, "alert": alert.to_dict()})
        self._control.pause("the guard skipped a non-finite update", self._index)

    def _end_anomaly(self) -> None:
        """Turn off an anomaly step that will not finish normally (close, failure)."""
        anomaly, self._anomaly = self._anomaly, None
        if anomaly is not None:
            anomaly.finish(None, scalars={}, paused=False, raise_on_anomaly=False)

    def _clear_grads(self) -> None:
        for param in self.layers.params:
            param.grad = None

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

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_step and not self._disabled:
            try:
                self._measurer.before_optimizer_step(guard=self._control.state.guard)
            except NonFiniteGradients:
                raise  # stops optimizer.step(); swallowed at the end of the step block
            except Exception as exc:
                self._fail(exc)
        elif self._last is not None:
            # optimizer.step() after the step's block: it still updates with that step's
            # gradients (the record, not yet sent, must not say the update was skipped).
            self._last.optimizer_step = True

    def _clipping(self, max_norm: float) -> None:
        """Called by ``probes.clip_grad_norm_`` before it clips."""
        if self._in_step and not self._disabled:
            try:
                self._measurer.clipping(max_norm)
            except Exception as exc:
                self._fail(exc)

    def owns(self, param: torch.Tensor) -> bool:
        """True if ``param`` is one of the watched model's trainable parameters."""
        return id(param) in self._param_ids

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

    # --- helpers --------------------------------------------------------------------

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
        warn(f"probe switched off after an error: {type(exc).__name__}: {exc}")
        self.sender.put({"kind": "event", "name": "probe_error", "step": max(self._index, 0),
                         "time": time.time(), "message": f"{type(exc).__name__}: {exc}"})

    def _hello(self) -> dict[str, Any]:
        rank, world = _rank_and_world()
        hello: dict[str, Any] = {
            "run": self.run_id,
            "name": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": rank,
            "world_size": world,
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


class _StepScope:
    """The ``with probe.step():`` block; a class rather than a generator, for speed."""

    __slots__ = ("_index", "_probe")

    def __init__(self, probe: Probe, index: int | None) -> None:
        self._probe = probe
        self._index = index

    def __enter__(self) -> Probe:
        probe = self._probe
        if not (probe._disabled or probe._closed):
            try:
                probe._enter_step(self._index)
            except Exception as exc:
                probe._fail(exc)
        else:  # switched off: still count steps, so events keep their step
            probe._index = probe._index + 1 if self._index is None else self._index
        return probe

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        probe = self._probe
        swallow = False
        if probe._in_step and not probe._disabled:
            try:
                swallow = probe._exit_step(exc)
            except Exception as error:
                probe._fail(error)
        probe._in_step = False
        return swallow


class _EvalScope:
    """State of one ``evaluate()`` block: scalars, and how the forward passes ran."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.time = time.time()
        self.tensors: dict[str, torch.Tensor] = {}
        self.floats: dict[str, float] = {}
        self.forwards = 0
        self.train_mode_forwards = 0
        self.grad_forwards = 0
        self.handle = probe.model.register_forward_pre_hook(eager(self._on_forward))

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        # Plain attribute reads and sums: nothing here can raise into the user's forward.
        self.forwards += 1
        self.train_mode_forwards += int(module.training)
        self.grad_forwards += int(torch.is_grad_enabled())

    def log(self, scalars: dict[str, Scalar]) -> None:
        self.probe._log_into(self.tensors, self.floats, scalars)

    def finish(self) -> None:
        self.handle.remove()
        try:
            scalars = {**{k: float(t) for k, t in self.tensors.items()}, **self.floats}
            self.probe._put_after_step({
                "kind": "eval",
                "step": max(self.probe._index, 0),
                "time": self.time,
                "scalars": scalars,
                "forwards": self.forwards,
                "train_mode_forwards": self.train_mode_forwards,
                "grad_forwards": self.grad_forwards,
            })
        except Exception as exc:
            self.probe._fail(exc)


PAUSE_GRACE_ENV = "TRAINTOP_PAUSE_GRACE"
DEFAULT_PAUSE_GRACE_S = 10.0


def _grace_seconds(explicit: float | None) -> float:
    if explicit is not None:
        return explicit
    try:
        return float(os.environ.get(PAUSE_GRACE_ENV, DEFAULT_PAUSE_GRACE_S))
    except ValueError:
        return DEFAULT_PAUSE_GRACE_S


@dataclass(frozen=True)
class LrExperiment:
    """The monitor's learning-rate change, watched until the LR next moves."""

    step: int  # the first step run with it
    factor: float
    before: list[float]
    set_to: list[float]

    WATCH_STEPS: ClassVar[int] = 1000  # unchanged this long: it held

    def undone_by(self, now: list[float]) -> bool:
        """True if the learning rates went back near their values before the change
        (a scheduler recomputing them from its base), not on with it (StepLR's decay)."""
        return len(now) == len(self.before) and all(
            math.isclose(n, b, rel_tol=0.25) for n, b in zip(now, self.before, strict=True))

    def alert(self, step: int, now: list[float]) -> Alert:
        return Alert(
            "lr_experiment_undone", "info", step, "",
            {"factor": self.factor, "lr_before": self.before[0], "lr_set": self.set_to[0],
             "lr_now": now[0], "lasted_steps": step - self.step},
            "The learning rate went back to about where it was before the change: the loop "
            "may set it each step (a scheduler recomputing it), so the experiment may not "
            "have lasted; a decay that happens to land there looks the same. The marker on "
            "the chart shows when it began, not that it held.",
            ("Change the scheduler's base learning rate (max_lr, base_lrs) and restart.",
             "Or step the scheduler less often while experimenting; nothing else changes.",
             "Compare a few hundred steps before and after, on the same data order."),
        )


def guard_alert(error: NonFiniteGradients) -> Alert:
    """The alert the guard raises when it skips an update."""
    layers = ", ".join(error.layers[:6])
    return Alert(
        "guard_skipped_update", "error", error.step, error.layers[0] if error.layers else "",
        {"non_finite_layers": len(error.layers), "layers": layers,
         "first_value": error.norms[0] if error.norms else float("nan")},
        "Non-finite gradients reached optimizer.step(): the guard skipped this update, as "
        "GradScaler does, so the weights stay finite, and paused the run. It hides the "
        "symptom once; it does not remove the cause.",
        ("Run the next step under anomaly detection (press a) to find the op and layer.",
         "Lower the learning rate alone (x0.5) and resume.",
         "Inspect this step's batch for extreme or non-finite inputs."),
    )


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


_open_probes: weakref.WeakSet[Probe] = weakref.WeakSet()


def probes_watching(param: torch.Tensor) -> list[Probe]:
    """The open probes whose model trains ``param``."""
    return [probe for probe in list(_open_probes) if probe.owns(param)]


def end_reason(error: BaseException | None) -> str:
    """What the bye says of how the run ended: "closed", "interrupted" or the error."""
    if error is None:
        return "closed"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, SystemExit):  # sys.exit(): clean unless it carries a failure
        return "closed" if error.code in (None, 0) else f"exit status {error.code}"
    return f"error: {type(error).__name__}: {error}"[:300]


@atexit.register
def _close_open_probes() -> None:
    """Flush probes left open at interpreter exit, so the last steps are not lost; an
    uncaught exception (``sys.last_value``, set before exit handlers run) is the reason."""
    # In an interactive session sys.last_value is any earlier traceback, not the end.
    interactive = hasattr(sys, "ps1") or bool(sys.flags.interactive)
    reason = "closed" if interactive else end_reason(getattr(sys, "last_value", None))
    for probe in list(_open_probes):
        probe._close(reason)


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
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
        optimizer: its optimizer; gradients are read just before ``optimizer.step()``
            (after any clipping), else at the end of the step.
        run: a name for the run in the monitor (default: model class and pid).
        address: the monitor's address (default: ``$TRAINTOP_ADDRESS``, else the
            per-user Unix socket).
        every: measure one step in ``every``.
        sample_every: costlier statistics (parameter norms, update/weight ratios,
            activation health) on one step in this many.
        grad_accumulation: you accumulate gradients over several steps on purpose;
            the check that ``zero_grad`` runs every step is then off.
        guard: skip ``optimizer.step()`` when a gradient is non-finite (as AMP's
            GradScaler does), raise an alert and pause. Costs one host/device sync
            per step. The monitor's ``g`` key turns it on and off.
        on_anomaly: what an anomaly step (the monitor's ``a`` key) does when it
            catches a non-finite gradient: ``"pause"`` (skip the update, pause the run)
            or ``"raise"`` (re-raise the error into the training loop).
        **options: ``pause_grace_s`` (how long a paused run waits for a monitor that
            went away; default 10, or ``$TRAINTOP_PAUSE_GRACE``), ``queue_size``,
            ``history``, ``max_steps_per_s``.

    Returns:
        A ``Probe``; also a context manager that closes it.

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
