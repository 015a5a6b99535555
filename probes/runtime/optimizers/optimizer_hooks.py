"""Every hook on the watched optimizer, in one owner: registered here, removed on close.

Two hooks stay for the life of the probe, one on each side of ``optimizer.step()``
(one Python call each a step, not one per part): before it the step boundary reads the
gradients (``StepBoundary.before_optimizer_step``), then the update check notes the
parameters' versions; after it, the update check names the layers the step left
untouched (``probes.runtime.live_checks.structure.UpdateCheck``), and the clearing watch notes the
gradients the update used (``probes.runtime.optimizers.clearing``: the next backward must find
them cleared). The measurer adds a post-hook of its own on the steps that measure the
update (``add_post_hook``): registered then, so it runs after any hook the training
code added meanwhile, as it always has. On sampled steps, where the model has bfloat16
or float16 parameters, the same two hooks count the weights the step left bit-identical
(``probes.runtime.measure.dtype_stall``; a float32 model has none, and pays one ``is None``).
Several optimizers (``optimizers.OptimizerSet``) carry those hooks on each, and a pair
of their own each (``add_each``): each one's parameters read at its own step.

A hook of ours is never removed while torch runs the optimizer's hooks: removing one
there (the probe switched off by an error inside a hook) would change the dictionary
torch iterates, and raise into ``optimizer.step()``. It is made inert in place instead,
and removed at the next removal outside the hooks (the probe's close).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from probes.kernel.diagnosis import Alert
from probes.runtime.live_checks.structure import UpdateCheck, counters_blind
from probes.runtime.measure.dtype_stall import DtypeStall
from probes.runtime.measure.layers import LayerMap
from probes.runtime.measure.stats import Measurement

PreHook = Callable[[Any, tuple[Any, ...], dict[str, Any]], tuple[Any, Any] | None]
PostHook = Callable[[Any, Any, Any], None]


def _inert(*args: Any) -> None:
    """A hook removed while torch iterated the hooks: it does nothing until removed."""


def _nothing() -> None:
    """No mark to make."""


class _Handle(RemovableHandle):
    """A hook's handle whose ``remove`` waits until no hook of the owner is running."""

    def __init__(self, owner: OptimizerHooks, handle: RemovableHandle) -> None:  # (no registry)
        self._owner, self._handle = owner, handle

    def remove(self) -> None:
        self._owner.remove_handle(self._handle)


class CurrentStep(Protocol):
    """What the hooks read of the measurer: the step being measured, if any."""

    current: Measurement | None


class OptimizerHooks:
    """The one owner of the probe's hooks on ``optimizer`` (None: no hooks at all).

    Args:
        optimizer: the real optimizer (unwrapped), or None.
        on_error: called with an exception raised inside a hook of ours (it switches
            the probe off; nothing is raised into ``optimizer.step()``).
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer | None, *, on_error: Callable[[Exception], None]
    ) -> None:
        self.optimizer = optimizer
        self._on_error = on_error
        self._handles: list[RemovableHandle] = []
        self._transient: RemovableHandle | None = None  # the measurer's, this step
        self._check: UpdateCheck | None = None
        self._stall: DtypeStall | None = None  # (low-precision parameters only)
        self._before_step: PreHook | None = None  # the step boundary's
        self._measurer: CurrentStep | None = None
        self._updated: Callable[[], None] | None = None
        self._check_spent = 0.0  # the pre-hook's check seconds, added to probe_time after
        self._checked: Measurement | None = None  # the step the last update check was of
        self._running = 0  # hooks of ours running now (torch iterates its hooks)
        self._deferred: list[RemovableHandle] = []  # made inert there, removed later
        self._update_begins: Callable[[], None] = _nothing  # the step's phases' marks
        self._update_ends: Callable[[], None] = _nothing

    def install(
        self,
        *,
        before_step: PreHook,
        layers: LayerMap,
        measurer: CurrentStep,
        updated: Callable[[], None] | None = None,
        send: Callable[[dict[str, Any]], None] | None = None,
        timed: tuple[Callable[[], None], Callable[[], None]] | None = None,
    ) -> None:
        """Hook ``optimizer.step()``: ``before_step`` (the step boundary's) and the
        update check of ``layers`` before it, the update check and ``updated`` after it;
        on sampled steps, the count of low-precision weights the step left unchanged,
        whose alerts go to ``send`` (``probes.runtime.measure.dtype_stall``); ``timed``'s
        two marks first thing on each side (``probes.runtime.measure.phases``)."""
        optimizer = self.optimizer
        if optimizer is None:
            return
        self._measurer = measurer
        self._updated = updated
        self._before_step = before_step
        if timed is not None:
            self._update_begins, self._update_ends = timed
        if layers.params:
            self._check = UpdateCheck(layers, blind=counters_blind(optimizer))
            if send is not None:
                self._stall = DtypeStall.of(layers, _sender(send))
        self._handles.append(optimizer.register_step_pre_hook(self._before))
        if self._check is not None or timed is not None:
            self._handles.append(optimizer.register_step_post_hook(self._after))

    def add_each(
        self,
        before: Callable[[int], Callable[..., None]],
        after: Callable[[int], Callable[..., None]],
    ) -> None:
        """Hook each optimizer of a set (``optimizers.OptimizerSet``) on its own:
        ``before(i)`` and ``after(i)`` on the i-th, for the life of the probe (each
        optimizer's own reads: ``optimizers.PerOptimizerReads``). Added before
        ``install``, they run before the boundary's hooks."""
        for index, optimizer in enumerate(getattr(self.optimizer, "optimizers", ())):
            pre = optimizer.register_step_pre_hook(self._guarded(before(index)))
            post = optimizer.register_step_post_hook(self._guarded(after(index)))
            self._handles += [pre, post]

    def add_post_hook(self, hook: PostHook) -> RemovableHandle:
        """Register ``hook`` after ``optimizer.step()`` for now (the measurer's, on the
        steps that measure the update); its caller removes it, and close does too."""
        assert self.optimizer is not None
        if self._transient is not None:
            self.remove_handle(self._transient)  # (removed already, normally: one at a time)
        self._transient = self.optimizer.register_step_post_hook(self._guarded(hook))
        return _Handle(self, self._transient)

    def remove(self) -> None:
        """Remove every hook (idempotent); inside a hook, make them inert instead."""
        for handle in self._handles:
            self.remove_handle(handle)
        self._handles.clear()
        if self._transient is not None:
            self.remove_handle(self._transient)
            self._transient = None
        if not self._running:
            for handle in self._deferred:
                handle.remove()
            self._deferred.clear()

    def remove_handle(self, handle: RemovableHandle) -> None:
        """Remove one hook of ours, or, while torch runs the hooks, make it inert."""
        if not self._running:
            handle.remove()
            return
        hooks = handle.hooks_dict_ref()
        if hooks is not None and handle.id in hooks:
            hooks[handle.id] = _inert  # a value replaced: the iteration goes on unharmed
            self._deferred.append(handle)

    def _guarded(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any) -> Any:
            self._running += 1
            try:
                return hook(*args)
            finally:
                self._running -= 1

        return guarded

    def _mark(self, mark: Callable[[], None]) -> None:
        try:
            mark()
        except Exception as exc:  # never into the user's optimizer.step()
            self._on_error(exc)

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """Before ``optimizer.step()``: the boundary's reading, then the update check's
        versions (the (args, kwargs) the boundary returns, with a closure wrapped)."""
        self._running += 1
        try:
            self._mark(self._update_begins)
            assert self._before_step is not None
            result = self._before_step(optimizer, args, kwargs)
            check = self._check
            if check is not None:
                started = time.perf_counter()
                try:
                    current = self._measurer.current if self._measurer is not None else None
                    if current is not None:
                        check.before()
                        if current.sampled and self._stall is not None:
                            self._stall.before(optimizer)
                except Exception as exc:  # never into the user's optimizer.step()
                    self._on_error(exc)
                self._check_spent = time.perf_counter() - started
            return result
        finally:
            self._running -= 1

    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """After ``optimizer.step()``: the layers it left untouched, and the gradients
        it used (the next backward must find them cleared)."""
        self._running += 1
        self._mark(self._update_ends)
        started = time.perf_counter()
        try:
            step = self._measurer.current if self._measurer is not None else None
            if self._check is None:
                return
            untouched = self._check.after()
            stall = self._stall
            if stall is not None and stall.taken:  # (a sampled step)
                if step is None:
                    stall.discard()
                else:
                    stall.after(step.step)
            elif stall is not None and stall.waiting:  # (counts on their way from CUDA)
                stall.poll()
            if self._updated is not None:
                self._updated()  # every update, measured or not
            if step is not None:
                if untouched is not None and self._checked is step:
                    # another optimizer of the step already ran: untouched by all of them
                    untouched = [i for i in untouched if i in (step.not_stepped or ())]
                    step.not_stepped = None
                self._checked = step
                if untouched:
                    step.not_stepped = untouched
                # the probe's own time on the training thread, as the rest of it counts
                step.probe_time += self._check_spent + time.perf_counter() - started
        except Exception as exc:
            self._on_error(exc)
        finally:
            self._running -= 1


def _sender(send: Callable[[dict[str, Any]], None]) -> Callable[[Alert, int], None]:
    """An alert of the training side's, as the record ``send`` takes."""

    def send_alert(alert: Alert, step: int) -> None:
        send({"kind": "alert", "step": step, "alert": alert.to_dict()})

    return send_alert
