"""``probes.watch``: attach to a model (and optimizer) and report every step.

``Probe`` is the handle ``watch`` returns, and the public API: steps, scalars,
evaluation, events, closing. It holds no step state itself; it wires a small graph of
parts, each handed what it uses when it is made:

- ``StepBoundary`` (``probes.runtime.steps.step``): begins and ends steps, reads gradients
  where they are final, counts the probe's own time; owns the state of the step;
- ``OptimizerHooks`` (``probes.runtime.optimizers.optimizer_hooks``): every hook on the optimizer,
  registered and removed in one place;
- ``StepMeasurer`` (``probes.runtime.measure.measurer``): what a step measures;
- ``StepResources`` (``probes.runtime.measure.resources``): where its time and memory go;
- ``Control`` (``probes.runtime.link.control``): the monitor's commands, at step boundaries;
- ``Sender`` (``probes.runtime.link.sender``): records to the monitor, on its own thread.

Helpers outside the graph reach the probe through public methods: ``send`` (check
reports), ``clipping`` / ``clipped`` (``probes.runtime.optimizers.clip``), ``close_with_reason``
(``probes.runtime.lifecycle`` at exit).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import torch
from torch import nn

from probes.kernel.commands import Command
from probes.kernel.schema import validation_loss_name
from probes.kernel.schema.spec import EventName
from probes.kernel.wire import TOKEN_ENV
from probes.runtime import lifecycle
from probes.runtime.evaluation.evaluation import EvalScope
from probes.runtime.job import job_identity, sync_of
from probes.runtime.link.control import Control, ControlState
from probes.runtime.link.hello import hello_fields
from probes.runtime.link.link import command_token, monitor_address
from probes.runtime.link.pace import grace_seconds, paced_sender
from probes.runtime.link.sender import Sender, warn
from probes.runtime.live_checks import loss_contract_live, torch_warnings
from probes.runtime.measure.layers import LayerMap, map_layers
from probes.runtime.measure.measurer import StepMeasurer
from probes.runtime.measure.resources import StepResources
from probes.runtime.measure.scalars import Scalar, ScalarFiler
from probes.runtime.optimizers import clip, optimizers
from probes.runtime.optimizers.optimizer_hooks import OptimizerHooks
from probes.runtime.options import WatchOptions
from probes.runtime.patches.hooks import see_compiles, unsee_compiles, unwrap
from probes.runtime.steps.scope import StepScope
from probes.runtime.steps.step import StepBoundary


class Probe:
    """A handle on a watched training run; see ``watch``.

    Use ``with probe.step():`` around each training step (or ``begin_step`` and
    ``end_step`` from a framework's callbacks), ``probe.log(loss=...)`` for scalars,
    ``with probe.evaluate():`` around validation, and ``close()`` (or use the probe as a
    context manager) at the end. Once made, the probe never raises into training: a
    failure inside it is reported once and the probe switches itself off.

    Args:
        model: the model being trained.
        optimizer: its optimizer, a wrapper that holds one, or a list of them.
        options: how to watch (``WatchOptions``; ``watch`` builds them from keywords).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Any | None = None,
        options: WatchOptions | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs an nn.Module, got {type(model).__name__}")
        self.options = options = options or WatchOptions()
        # the optimizer inside accelerate's or Lightning's wrapper, or several (TypeError:)
        self.optimizer = real_optimizer = optimizers.optimizer_of(optimizer)
        self.model = model
        self.module = unwrap(model)  # inside torch.compile / DDP wrappers: plain names
        self.layers: LayerMap = map_layers(self.module)
        self.run_id = uuid.uuid4().hex[:12]
        self.name = options.run or f"{type(self.module).__name__}-{os.getpid()}"
        self.address = monitor_address(options.address)  # None: unusable, said on stderr
        self.identity = job_identity(options.job)
        self.data_parallel = options.data_parallel or sync_of(model, self.identity)
        self._param_ids = {id(p) for p in self.layers.params}
        self._eval: EvalScope | None = None
        self._scalars = ScalarFiler()
        self._hooks = OptimizerHooks(real_optimizer, on_error=self._fail)
        self._measurer = measurer = StepMeasurer(
            *(self.module, self.layers, real_optimizer),
            grad_accumulation=options.grad_accumulation,
            on_error=self._fail,
            sample_every=options.sample_every,
            register_post_hook=self._hooks.add_post_hook,
            local_grads=self.data_parallel not in (None, "fsdp"),  # a rank's, pre all-reduce
        )
        self._per_optimizer = optimizers.attach(self._hooks, self.layers, measurer, self._fail)
        if options.guard and real_optimizer is None:
            warn("guard=True needs the optimizer: pass it to probes.watch")
        if not self.layers.params:
            warn(
                f"{self.name}: the model has no trainable parameters; only logged scalars "
                "will be recorded"
            )
        self._resources = StepResources(self.module, self._fail, options.time_and_memory)
        self._oom_reported = False
        self._control, self.sender = self._connect()
        self._boundary = StepBoundary(
            module=self.module,
            layers=self.layers,
            optimizer=real_optimizer,
            options=options,
            identity=self.identity,
            measurer=self._measurer,
            control=self._control,
            sender=self.sender,
            scalars=self._scalars,
            resources=self._resources,
            on_error=self._fail,
        )
        self.sender.on_non_finite = self._boundary.anomalies.auto.saw_non_finite  # (auto_anomaly)
        self._boundary.on_out_of_memory = self.report_out_of_memory
        self._boundary.inferred.find_evaluations(self.begin_evaluation, self._end_found_evaluation)
        self._next_step_scope = StepScope(self._boundary, self, None)
        self._hooks.install(
            before_step=self._boundary.before_optimizer_step,
            layers=self.layers,
            measurer=self._measurer,
            updated=self._measurer.clearing.updated,
            send=self.send,  # (the low-precision stall's alerts: runtime/measure/dtype_stall.py)
            timed=self._resources.update_marks,
        )
        clip.install()  # frameworks clip through torch's function: read before it
        see_compiles()  # a torch.compile wrapper made later is where the model is entered
        lifecycle.register(self)
        self._torch_warnings = torch_warnings.watch(self)  # torch's own, during steps
        # the loss's contract on the first and sampled steps' loss calls (rung 2, live)
        self._loss_contract = loss_contract_live.watch(self, self._boundary.count_time)
        for alert in self._boundary.wiring.first_alerts(self.layers):  # (and again later)
            self.send({"kind": "alert", "step": 0, "alert": alert.to_dict()})

    def _connect(self) -> tuple[Control, Sender]:
        """The run's control (commands at step boundaries) and its sender thread."""
        options, optimizer = self.options, self.optimizer
        connected = threading.Event()
        control = Control(
            connected=connected,
            send=self.send,
            scale_lr=self._scale_lr if optimizer is not None else None,
            grace_s=grace_seconds(options.pause_grace_s),
            token=command_token(self.address, os.environ.get(TOKEN_ENV)),
            run_id=self.run_id,
            guard=options.guard and optimizer is not None,
        )
        hello = hello_fields(
            run_id=self.run_id,
            name=self.name,
            model=self.model,
            module=self.module,
            optimizer=optimizer,
            layers=self.layers,
            activations=self._measurer.activations.names,
            identity=self.identity,
            sync=self.data_parallel,
            options=options,
        )
        if self._resources.memory_source is not None:
            hello["memory_source"] = self._resources.memory_source
        sender = paced_sender(self.address, hello, options, self.identity, control, connected)
        return control, sender

    # --- public API -----------------------------------------------------------------

    @property
    def step_index(self) -> int:
        """Index of the current (or last) step; -1 before the first."""
        return self._boundary.index

    @property
    def closed(self) -> bool:
        return self._boundary.closed

    @property
    def in_step(self) -> bool:
        """True between ``begin_step`` and ``end_step``."""
        return self._boundary.in_step

    @property
    def evaluating(self) -> bool:
        """True between ``begin_evaluation`` and ``end_evaluation``."""
        return self._eval is not None

    def step(self, index: int | None = None) -> StepScope:
        """Context manager around one training step (forward, backward, update).

        Args:
            index: the step's index, when resuming from a checkpoint; by default the
                previous index plus one, starting at 0.
        """
        if index is None:
            return self._next_step_scope  # reused: one object less per step
        return StepScope(self._boundary, self, index)

    def begin_step(self, index: int | None = None) -> None:
        """A training step begins (what ``with probe.step():`` does on entry).

        For loops the caller does not own: a framework callback calls this at the start
        of each optimizer step (its first micro-batch under gradient accumulation). A
        paused run blocks here until the monitor resumes or steps it.

        Args:
            index: the step's index (e.g. the framework's global step); by default the
                previous index plus one, starting at 0.
        """
        self._boundary.begin_step(index)

    def gradients_final(self) -> None:
        """The gradients of this step are final: read them now, if not read yet.

        Needed only where nothing else tells: the optimizer's step and torch's
        ``clip_grad_norm_`` already do. A framework calls it before it clips by other
        means, or before it clears the gradients of a step with no optimizer watched.
        """
        self._boundary.gradients_final()

    def end_step(self, error: BaseException | None = None) -> bool:
        """The step ends (what ``with probe.step():`` does on exit).

        Args:
            error: the exception that ended the step, if one did.

        Returns:
            True when ``error`` is the anomaly step's own and the probe dealt with it (the
            update was skipped, the run pauses): a ``with`` block swallows it then.
        """
        return self._boundary.end_step(error)

    def log(self, **scalars: Scalar) -> None:
        """Record scalars for the current step, or for the eval inside ``evaluate()``.

        Values may be floats, ints or one-element tensors; tensors are not read here
        (no ``.item()``, no device sync): they travel with the step's batched copy.
        Called after a step's ``with`` block, they attach to that step.
        """
        boundary = self._boundary
        if boundary.disabled or boundary.closed:
            return
        scope = self._eval
        if scope is None:
            boundary.log(scalars)
            return
        started = time.perf_counter()
        try:
            self._scalars.file(scope.tensors, scope.floats, scalars)
        except Exception as exc:
            self._fail(exc)
        boundary.count_time(started)  # (an evaluate() inside the step)

    @contextmanager
    def evaluate(self) -> Iterator[Probe]:
        """Context manager around validation; ``log`` inside it makes an ``eval`` record.

        The record is tagged with the step the script is at: after N completed steps
        (outside a step), step N, the index of the next step, as a framework's
        ``global_step`` counts (an evaluation after step 49's update is at step 50, and
        one before the first step at 0); inside an open step, that step's index. The
        probe also notes whether the model's forward passes ran in training mode or
        with gradient recording on (the two controls are orthogonal: ``model.eval()``
        and ``torch.inference_mode()``).
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
        boundary = self._boundary
        if boundary.disabled or boundary.closed or self._eval is not None:
            return False
        try:
            layers = set(self.layers.names)
            modules = [
                self.module,
                *(m for n, m in self.module.named_modules() if n and n in layers),
            ]
            # the weights it sees: N updates done (the step that updates them next)
            at = boundary.index if boundary.in_step else boundary.index + 1
            self._eval = EvalScope(modules, at)
            self._resources.evaluation_begins()
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
            self._resources.evaluation_ends()
            self._scalars.file(scope.tensors, scope.floats, scalars)
            self._boundary.put_after_step(dict(scope.record()))
        except Exception as exc:
            scope.remove_hooks()
            self._fail(exc)

    def _end_found_evaluation(self, losses: dict[str, Scalar]) -> None:
        """An evaluation found with no step API ends (``probes.runtime.evaluation.autoeval``) with
        the losses it saw; a validation loss the script logged in it wins over them. One
        with no loss and nothing logged judged no output: sampling, dropped unsent."""
        scope = self._eval
        if scope is not None and validation_loss_name([*scope.tensors, *scope.floats]):
            losses = {}
        elif scope is not None and not (losses or scope.tensors or scope.floats):
            self._eval = None
            scope.remove_hooks()
            return
        self.end_evaluation(**losses)

    @property
    def update_skipped(self) -> bool:
        """True when the last step's update was skipped (guard or anomaly step)."""
        return self._boundary.skipped

    @property
    def control(self) -> ControlState:
        """Paused, anomaly steps armed, guard: as the monitor sees them."""
        return self._control.state

    def arm_anomaly(self, steps: int = 1) -> None:
        """Run the next ``steps`` steps under anomaly detection (as the ``a`` key does)."""
        self._control.receive(
            {"command": Command.ANOMALY.value, "args": {"count": steps, "step_now": False}}
        )

    def event(self, name: str, **fields: Any) -> None:
        """Send a named event (an LR change, a restart, ...) tied to the current step."""
        if self._boundary.closed:
            return
        self.send(
            {
                "kind": "event",
                "name": name,
                "step": max(self._boundary.index, 0),
                "time": time.time(),
                **fields,
            }
        )

    def send(self, record: dict[str, Any]) -> None:
        """Queue a record (an alert, a check report, an event) to the monitor; never
        blocks. For helpers that report through the probe (``probes.checks.reports``)."""
        self.sender.put(record)

    def clipping(self, max_norm: float, norm_type: float = 2.0) -> None:
        """A clip of this probe's gradients is about to run: read them first, unclipped.
        For ``probes.clip_grad_norm_``, which calls it."""
        self._boundary.clipping(max_norm, norm_type)

    def clipped(self, total_norm: torch.Tensor) -> None:
        """The clip ran; ``total_norm`` is torch's norm before it. For
        ``probes.clip_grad_norm_``, which calls it."""
        self._boundary.clipped(total_norm)

    def close(self, error: BaseException | None = None) -> None:
        """Remove every hook, flush what is measured, say bye and stop the sender.

        Args:
            error: the exception that ended the run, if one did (the monitor shows it
                instead of "finished").

        Closing twice is a no-op.
        """
        self.close_with_reason(lifecycle.end_reason(error))

    def close_with_reason(self, reason: str) -> None:
        """``close``, telling the monitor why the run ended in its own words ("closed",
        "interrupted", "error: ..."); at interpreter exit, ``probes.runtime.lifecycle``
        closes the probes left open so."""
        boundary = self._boundary
        if not boundary.close():
            return
        lifecycle.unregister(self)
        clip.uninstall()
        unsee_compiles()
        self._torch_warnings.remove()
        self._loss_contract.remove()
        optimizers.detach(self._per_optimizer)
        self._hooks.remove()
        self._resources.remove()
        self._measurer.clearing.remove()
        self._measurer.undivided.remove()
        if self._eval is not None:
            self._eval.remove_hooks()
            self._eval = None
        boundary.abandon()  # activation hooks and anomaly mode of a step left open
        try:
            boundary.flush_last()
        finally:
            self.sender.close(reason=reason)

    def report_out_of_memory(self, error: BaseException) -> None:
        """A step ran out of memory (``error``): its report (``docs/time-and-memory.md``)
        to the monitor and stderr, once (and at exit, for an error no step saw)."""
        boundary = self._boundary
        if not (self._oom_reported or boundary.closed or boundary.disabled):
            self._oom_reported = True
            try:
                alert = self._resources.out_of_memory(error, max(boundary.index, 0), self.optimizer)
                warn(alert.line())
                self.send({"kind": "alert", "step": alert.step, "alert": alert.to_dict()})
            except Exception as exc:
                self._fail(exc)

    def __enter__(self) -> Probe:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close_with_reason(lifecycle.end_reason(exc))

    def owns(self, param: torch.Tensor) -> bool:
        """True if ``param`` is one of the watched model's trainable parameters."""
        return id(param) in self._param_ids

    # --- the parts' callbacks ---------------------------------------------------------

    def _scale_lr(self, factor: float) -> list[float]:
        """The control's LR experiment (applied at a step boundary, by the boundary)."""
        return self._boundary.scale_lr(factor)

    def _fail(self, exc: BaseException) -> None:
        """Switch the probe off after an internal error; training goes on."""
        if not self._boundary.switch_off():
            return
        if self._eval is not None:
            with contextlib.suppress(Exception):
                self._eval.remove_hooks()
            self._eval = None
        warn(f"probe switched off after an error: {type(exc).__name__}: {exc}")
        self.event(EventName.PROBE_ERROR, message=f"{type(exc).__name__}: {exc}")


def watch(
    model: nn.Module, optimizer: torch.optim.Optimizer | Any | None = None, **options: Any
) -> Probe:
    """Watch a training run: per-step loss, per-layer gradient norms and more.

    Args:
        model: the model being trained.
        optimizer: its optimizer, or a wrapper that holds one (accelerate's, Lightning's),
            or a list of them (a GAN's ``[opt_g, opt_d]``: each one's parameters read at
            its own ``step()``); gradients are read in ``optimizer.step()`` (after a
            closure's backward) or before a ``clip_grad_norm_``, whichever comes first.
        **options: any of ``WatchOptions`` (its docstring says what each does), e.g.
            ``run``, ``every``, ``sample_every``, ``guard``, ``infer_steps``.

    Returns:
        A ``Probe``; also a context manager that closes it.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``optimizer`` is neither an
            optimizer nor a wrapper of one, or an option is unknown (the message lists
            the known ones).
        ValueError: an option's value is out of range.

    With no ``probe.step()`` the steps are found in the loop (``infer_steps``): one ends
    at each ``optimizer.step()``, its loss is what ``backward()`` ran from. Example::

        with probes.watch(model, optimizer, run="resnet-baseline") as probe:
            for x, y in loader:
                with probe.step():
                    loss = F.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    probe.log(loss=loss)
    """
    return Probe(model, optimizer, WatchOptions.of(options))
