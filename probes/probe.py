"""``probes.watch``: attach to a model (and optimizer) and report every step."""

from __future__ import annotations

import atexit
import math
import os
import socket
import sys
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.layers import LayerMap, map_layers
from probes.sender import Sender, warn
from probes.stats import Measurement, NormReducer, compose_order, to_host
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
        queue_size: int = 8192,
        history: int = 1024,
        max_steps_per_s: float = 60.0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs an nn.Module, got {type(model).__name__}")
        if every < 1 or sample_every < 1:
            raise ValueError("every and sample_every must be at least 1")
        self.model = model
        self.optimizer = optimizer
        self.every = every
        self.sample_every = sample_every
        self.layers: LayerMap = map_layers(model)
        self.run_id = uuid.uuid4().hex[:12]
        self.name = run or f"{type(model).__name__}-{os.getpid()}"
        self.address = resolve_address(address)
        self._handles: list[RemovableHandle] = []
        self._index = -1
        self._in_step = False
        self._measuring = False
        self._step_started = 0.0
        self._step_wall = 0.0
        self._norms = NormReducer()
        self._next_step_scope = _StepScope(self, None)
        self._grad_norms: list[torch.Tensor] = []
        self._grad_present: tuple[int, ...] | None = None
        self._grad_order: tuple[int, ...] | None = None
        self._none_grads = 0
        self._tensor_scalars: dict[str, torch.Tensor] = {}
        self._float_scalars: dict[str, float] = {}
        self._last: Measurement | None = None
        self._eval: _EvalScope | None = None
        self._disabled = False
        self._closed = False
        if not self.layers.params:
            warn(f"{self.name}: the model has no trainable parameters; only logged scalars "
                 "will be recorded")
        # Tensor learning rates (capturable schedulers) must travel with the batched copy.
        self._tensor_lrs = optimizer is not None and any(
            isinstance(g.get("lr"), torch.Tensor) for g in optimizer.param_groups)
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
        self.sender = Sender(
            self.address,
            self._hello(),
            queue_size=queue_size,
            history_capacity=history,
            max_steps_per_s=max_steps_per_s,
        )
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
            elif self._in_step:
                self._log_into(self._tensor_scalars, self._float_scalars, scalars)
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
        if self._closed:
            return
        self._closed = True
        _open_probes.discard(self)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        try:
            self._flush_last()
        finally:
            self.sender.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- step boundary --------------------------------------------------------------

    def _enter_step(self, index: int | None) -> None:
        self._flush_last()
        self._index = self._index + 1 if index is None else index
        self._in_step = True
        self._measuring = self._index % self.every == 0
        self._grad_norms = []
        self._grads_read = False
        self._tensor_scalars = {}
        self._float_scalars = {}
        self._step_wall = time.time()
        self._step_started = time.perf_counter()

    def _exit_step(self, failed: bool) -> None:
        duration = time.perf_counter() - self._step_started
        self._in_step = False
        if failed or not self._measuring:
            return
        if not self._grads_read:
            self._measure_grads()
        self._last = self._measurement(duration)

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_step and self._measuring and not self._disabled:
            try:
                self._measure_grads()
            except Exception as exc:
                self._fail(exc)

    def _measure_grads(self) -> None:
        """Launch the batched per-parameter gradient norms (nothing is read yet)."""
        grads: list[torch.Tensor] = []
        present: list[int] = []
        for index, param in enumerate(self.layers.params):
            grad = param.grad
            if grad is not None:
                grads.append(grad)
                present.append(index)
        self._none_grads = len(self.layers.params) - len(grads)
        self._grad_present = None if not self._none_grads else tuple(present)
        self._grads_read = True
        if grads and grads[0].requires_grad:
            # Grads made by backward(create_graph=True): the norms must not grow a graph.
            with torch.no_grad():
                self._grad_norms, self._grad_order = self._norms.norms(grads)
        elif grads:
            self._grad_norms, self._grad_order = self._norms.norms(grads)
        else:
            self._grad_norms, self._grad_order = [], None

    def _measurement(self, duration: float) -> Measurement:
        """Stack this step's norms and tensor scalars and start their copy to host."""
        values: list[torch.Tensor] = list(self._grad_norms)
        grad_count = len(values)
        param_count, param_order = 0, None
        if self.layers.params and self._index % self.sample_every == 0:
            with torch.no_grad():
                param_norms, param_order = self._norms.norms(
                    [p.detach() for p in self.layers.params])
            values += param_norms
            param_count = len(param_norms)
        names = self._append_tensor_scalars(values)
        host, event = to_host(values) if values else (None, None)
        return Measurement(
            layer_map=self.layers,
            step=self._index,
            time=self._step_wall,
            duration=duration,
            values=host,
            event=event,
            grad_present=compose_order(self._grad_present, self._grad_order),
            grad_count=grad_count,
            param_count=param_count,
            param_order=param_order,
            tensor_scalar_names=names,
            float_scalars=self._float_scalars,
            lrs=self._learning_rates(),
            none_grads=self._none_grads,
        )

    def _append_tensor_scalars(self, values: list[torch.Tensor]) -> tuple[str, ...]:
        """Append the logged tensor scalars (and tensor LRs) to ``values``; their names."""
        scalars = self._tensor_scalars
        if self.optimizer is not None and self._tensor_lrs:
            scalars = dict(scalars)
            for i, group in enumerate(self.optimizer.param_groups):
                if isinstance(group.get("lr"), torch.Tensor):
                    scalars[f"lr/{i}"] = group["lr"].detach()
        if not scalars:
            return ()
        like = values[0] if values else next(iter(scalars.values()))
        device, dtype = like.device, (like.dtype if values else torch.float32)
        for tensor in scalars.values():
            if tensor.dtype != dtype or tensor.device != device or tensor.dim():
                tensor = tensor.reshape(()).to(device=device, dtype=dtype, non_blocking=True)
            values.append(tensor)
        return tuple(scalars)

    def _learning_rates(self) -> list[float]:
        if self.optimizer is None:
            return []
        if not self._tensor_lrs:
            return [float(g.get("lr", math.nan)) for g in self.optimizer.param_groups]
        # Tensor LRs travel with the batched copy (see _append_tensor_scalars).
        return [math.nan if isinstance(g.get("lr"), torch.Tensor) else float(g.get("lr", math.nan))
                for g in self.optimizer.param_groups]

    def _flush_last(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            self.sender.put(last)

    # --- helpers --------------------------------------------------------------------

    def _log_into(
        self,
        tensors: dict[str, torch.Tensor],
        floats: dict[str, float],
        scalars: dict[str, Scalar],
    ) -> None:
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"log({name}=...) needs one value, got a tensor of "
                                     f"shape {tuple(value.shape)}")
                tensors[name] = value.detach()
            elif isinstance(value, int | float) and not isinstance(value, bool):
                floats[name] = float(value)
            else:
                raise TypeError(f"log({name}=...) takes a float or a one-element tensor, "
                                f"got {type(value).__name__}")

    def _fail(self, exc: BaseException) -> None:
        """Switch the probe off after an internal error; training goes on."""
        if self._disabled:
            return
        self._disabled = True
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
            "model": type(self.model).__name__,
            "optimizer": type(self.optimizer).__name__ if self.optimizer else None,
            "layers": list(self.layers.names),
            "param_counts": list(self.layers.param_counts),
            "config": {"every": self.every, "sample_every": self.sample_every},
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
        return probe

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        probe = self._probe
        if probe._in_step and not probe._disabled:
            try:
                probe._exit_step(failed=exc_type is not None)
            except Exception as error:
                probe._fail(error)
        probe._in_step = False


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
        self.handle = probe.model.register_forward_pre_hook(self._on_forward)

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        self.forwards += 1
        self.train_mode_forwards += int(module.training)
        self.grad_forwards += int(torch.is_grad_enabled())

    def log(self, scalars: dict[str, Scalar]) -> None:
        self.probe._log_into(self.tensors, self.floats, scalars)

    def finish(self) -> None:
        self.handle.remove()
        try:
            scalars = {**{k: float(t) for k, t in self.tensors.items()}, **self.floats}
            self.probe.sender.put({
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


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


_open_probes: weakref.WeakSet[Probe] = weakref.WeakSet()


@atexit.register
def _close_open_probes() -> None:
    """Flush probes left open at interpreter exit, so the last steps are not lost."""
    for probe in list(_open_probes):
        probe.close()


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    run: str | None = None,
    address: str | Address | None = None,
    every: int = 1,
    sample_every: int = 20,
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
        sample_every: costlier statistics (parameter norms) on one step in this many.
        **options: ``queue_size``, ``history``, ``max_steps_per_s`` (see ``Probe``).

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
                 sample_every=sample_every, **options)
