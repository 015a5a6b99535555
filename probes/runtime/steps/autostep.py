"""Steps found in the loop itself: ``probes.watch(model, optimizer)`` alone measures it.

With no ``with probe.step():`` (nor a framework's callback calling ``begin_step``), a
probe infers its steps from what the loop does anyway:

- **a step ends at each ``optimizer.step()``**: a global post-step hook of torch's
  (``register_optimizer_step_post_hook``), which runs after every hook on the optimizer
  itself (the update check's, the measurer's update norms), ends it, and the next step
  begins there, so a pause, a single step, an armed anomaly step, the guard and the LR
  experiment all apply at the boundary after ``optimizer.step()``. A closure's
  backward, gradient accumulation (every backward until the step is one step) and
  ``GradScaler.step`` come with it: a scaler that skips the update (an inf found) still
  ends the step, its gradients read as they were. With several optimizers watched as
  one, the step ends when each has stepped once.
- **gradients** are read where they are today: ``optimizer.step()``'s pre-hook (the
  step begins there if no backward began it), before a clip.
- **the loss** is the one-element tensor ``backward()`` ran from (``torch.autograd.backward``
  is wrapped while such a probe is open; ``Tensor.backward`` goes through it), summed
  over the step's backwards, detached: no host sync, and what backward computes is
  untouched. A backward counts for a probe when it reached the probe's parameters (their
  first gradient moved). A loss a GradScaler scaled is taken unscaled (``amp``). With a
  closure, the loss is what its first call returned (LBFGS's own). ``probe.log(loss=)``
  wins where it is called.
- **with no optimizer**, a hand-written update (``p -= lr * p.grad`` under ``no_grad``,
  then a clear) ends the step: the next backward finds a parameter's version or the
  first gradient changed since the last backward, ends the step there and begins the
  next. An update through ``p.data`` that never clears the gradients is not seen
  (``.data`` has a version counter of its own): such a loop is one long step.

The explicit API takes precedence: the first ``begin_step`` not of this module switches
inference off for good. The first ``UNBRACKETED_UPDATES`` inferred steps are held back
for that: a warm-up update before a bracketed loop is dropped, as before, and the
bracketed steps count from 0; past them (or at close) the held steps are sent.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.amp.grad_scaler import GradScaler

from probes.runtime.evaluation.autoeval import InferredEvaluation
from probes.runtime.measure.layers import LayerMap
from probes.runtime.measure.stats import Measurement
from probes.runtime.optimizers import amp
from probes.runtime.patches.hooks import (
    EntryHandle,
    compile_wrapper_of,
    compiled_modules,
    entry_pre_hook,
)
from probes.runtime.patches.patches import Held, Layer
from probes.runtime.patches.seams import BACKWARD, OPTIMIZER_STEP_POST_HOOK, SCALER_STEP
from probes.runtime.steps.first_forward import FirstForwardHook
from probes.runtime.steps.unbracketed import UNBRACKETED_UPDATES

LOSS = "loss"  # the scalar's name, as ``probe.log(loss=...)`` files it


class Boundary(Protocol):
    """What inference asks of the probe's step boundary (``probes.runtime.steps.step``)."""

    in_step: bool
    disabled: bool
    closed: bool
    skipped: bool

    def begin_inferred(self) -> None: ...
    def end_step(self, error: BaseException | None = None) -> bool: ...
    def gradients_final(self) -> None: ...
    def drop_open_step(self) -> None: ...
    def drop_unsent(self) -> None: ...
    def flush_last(self) -> None: ...
    def send_now(self, record: Any) -> None: ...


class Clearing(Protocol):
    """What inference reads and tells of the clearing watch: a game (a GAN's players)."""

    discarded: bool  # this model's gradient was thrown away unused
    in_game: bool  # ... or another's, that this model's loss made


class CurrentStep(Protocol):
    """What inference reads of the measurer: the step being measured, if any."""

    current: Measurement | None

    @property
    def clearing(self) -> Clearing: ...

    def read_grads(self, step: Measurement) -> None: ...


class InferredSteps:
    """One probe's inferred steps (see the module).

    Args:
        module: the watched model, unwrapped (step 0 begins at its first forward).
        boundary: the probe's step boundary.
        measurer: its measurer (the step under way, the gradients' reading).
        layers: the watched layers and their trainable parameters.
        optimizers: the real optimizers watched (none: a hand-written update).
        enabled: the ``infer_steps`` option.
        on_error: switches the probe off after an internal error.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        boundary: Boundary,
        measurer: CurrentStep,
        layers: LayerMap,
        optimizers: tuple[torch.optim.Optimizer, ...],
        *,
        enabled: bool,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._boundary = boundary
        self._measurer = measurer
        self._optimizer_ids = frozenset(id(o) for o in optimizers)
        self._fail = on_error
        self.active = enabled and bool(layers.params)  # inferring (no explicit step seen)
        self.holding = self.active  # the first steps held back (see the module)
        self.implicit = False  # the open step was begun here
        self._held: list[Any] = []
        self._ended = 0  # inferred steps ended
        self._stepped: set[int] = set()  # optimizers stepped in the step under way
        self._loss: torch.Tensor | None = None
        self._loss_fixed = False  # a closure's loss: the backwards add nothing to it
        self.backward_seen = False  # a backward of ours in the step under way
        self.reached = False  # the latest backward reached this probe's parameters
        # Other probes a backward since this one's last update also reached (a GAN's G
        # loss through D): if this one's gradient from it is then thrown away, they
        # play a game with it (``_tell_players``).
        self._sharers: dict[int, weakref.ref[InferredSteps]] = {}
        firsts: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(layers.param_layer):
            firsts.setdefault(layer, layers.params[index])
        self._layer_firsts = list(firsts.values())  # each layer's first parameter
        self._mark: tuple[Any, int] | None = None  # (first grad, version) before a backward
        self._after_backward: tuple[list[int], Any, int] | None = None  # no optimizer
        self._module = weakref.ref(module)
        self._evaluation: InferredEvaluation | None = None  # (``find_evaluations``)
        self._first_forward: FirstForwardHook | EntryHandle | None = None
        if self.active:
            _install(self)
            if compiled_modules(module) or compile_wrapper_of(module) is not None:
                # Compiled: at its entry, outside the compiled region. A global hook would
                # be traced there, and its removal would recompile.
                self._first_forward = entry_pre_hook(module, self._forward_begins)
            else:  # one call: the model's own hook dictionaries stay as they were
                self._first_forward = FirstForwardHook(self._forward_begins)

    def _forward_begins(self, module: torch.nn.Module, args: Any) -> None:
        """Step 0 begins at the model's first forward with gradients on (or, failing
        that, at its first backward or ``optimizer.step()``)."""
        watched = self._module()
        if watched is None or not torch.is_grad_enabled():
            return
        # called through a ``torch.compile(model)`` wrapper: seen at its (eager) entry
        if module is watched or module is compile_wrapper_of(watched):
            hooks = module._forward_pre_hooks
            before = set(hooks)
            _safely(self, self.begin_if_idle)
            # torch took this call's hooks before ours ran: the step's own (the input's
            # scale, on a sampled step) see this forward through us
            for key in [k for k in hooks if k not in before]:
                if key not in module._forward_pre_hooks_with_kwargs:
                    _safely(self, hooks[key], module, args)

    def find_evaluations(self, begin: Callable[[], bool], end: Callable[..., None]) -> None:
        """Find the model's evaluations too (``probes.runtime.evaluation.autoeval``), opened and
        closed with the probe's ``begin_evaluation`` and ``end_evaluation``."""
        module = self._module()
        if self.active and module is not None:
            self._evaluation = InferredEvaluation(module, begin, end)

    def _evaluations_off(self) -> None:
        evaluation, self._evaluation = self._evaluation, None
        if evaluation is not None:
            evaluation.remove()

    # --- what the boundary tells ------------------------------------------------------

    def put(self, record: Any) -> None:
        """A record of an inferred step while they are held back."""
        self._held.append(record)

    def explicit_begin(self) -> None:
        """The step API is used: inference ends; an open inferred step is dropped, and
        held ones too (their updates were warm-ups: the explicit steps count from 0)."""
        self.active = False  # (the patches stay until close: others may wrap them now)
        _forget(self)  # torch's backward and step hooks no longer look at this probe
        self._stop_waiting()
        self._evaluations_off()
        boundary = self._boundary
        if self.implicit and boundary.in_step:
            boundary.drop_open_step()
        self.implicit = False
        if self.holding:
            self.holding = False
            self._held.clear()
            boundary.drop_unsent()

    def close(self) -> None:
        """The probe closes: a step a hand-written update ended is ended here; held
        steps are sent."""
        _uninstall(self)
        self._stop_waiting()
        self._evaluations_off()
        if not self.active:
            return
        self.active = False
        boundary = self._boundary
        if (
            self.implicit
            and boundary.in_step
            and not self._optimizer_ids
            and self.backward_seen
            and not boundary.disabled
        ):
            self._end(begin_next=False)
        self._release()

    def closure_loss(self, loss: Any) -> None:
        """A closure's first call returned ``loss``: the step's loss (LBFGS's own)."""
        if self.implicit and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._loss = loss.detach()
            self._loss_fixed = True

    def begin_if_idle(self) -> None:
        """``optimizer.step()`` or ``probe.log`` with no step open: begin one."""
        boundary = self._boundary
        if self.active and not boundary.in_step and not boundary.disabled:
            self._begin()

    # --- what the patched functions tell ----------------------------------------------

    def before_backward(self) -> None:
        boundary = self._boundary
        if boundary.disabled or boundary.closed:
            return
        if self._evaluation is not None:
            self._evaluation.finish()  # a backward: training again
        hand_written = not self._optimizer_ids and self.implicit and boundary.in_step
        if hand_written and self.backward_seen and self._updated_by_hand():
            self._end(begin_next=True)
        if not boundary.in_step:
            self._begin()
        elif self.implicit and not self.backward_seen:
            boundary.flush_last()  # the last step's record: no late ``log`` after this
            boundary.skipped = False  # (``update_skipped`` told of the last step till now)
        first = self._first_grad_holder()
        grad = None if first is None else first.grad
        self._mark = (grad, -1 if grad is None else grad._version)

    def after_backward(self, tensors: Any) -> None:
        self.reached = False
        boundary = self._boundary
        if not self.implicit or not boundary.in_step or boundary.disabled:
            return
        first = self._first_grad_holder()
        grad = None if first is None else first.grad
        mark = self._mark
        if grad is None or (mark is not None and mark[0] is grad and mark[1] == grad._version):
            return  # this backward did not reach our parameters
        self.reached = True
        self.backward_seen = True
        if not self._loss_fixed and isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            loss = amp.unscaled(tensors).detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if not self._optimizer_ids:
            step = self._measurer.current
            if step is not None:  # the last backward's gradients are the update's
                step.grads_read = False
                self._measurer.read_grads(step)
            self._after_backward = (
                [p._version for p in self._layer_firsts],
                grad,
                grad._version,
            )

    def shared(self, others: list[InferredSteps]) -> None:
        """The latest backward reached these probes' parameters too."""
        for other in others:
            self._sharers.setdefault(id(other), weakref.ref(other))

    def _tell_players(self) -> None:
        """At an update: if a gradient of this probe's was thrown away unused (another
        loss's passes, cleared before any update used them: ``ClearingWatch.discarded``),
        the probes whose backwards reached it since the last update are players of the
        same game (a GAN's G, whose loss goes through D): they say so too."""
        sharers, self._sharers = self._sharers, {}
        if not self._measurer.clearing.discarded:
            return
        for ref in sharers.values():
            other = ref()
            if other is not None:
                other.plays_a_game()

    def plays_a_game(self) -> None:
        """Another probe threw away a gradient this probe's loss made: its records say
        the run is a game from now on (``discarded_grads``)."""
        self._measurer.clearing.in_game = True

    def after_optimizer_step(self, optimizer: Any) -> None:
        if not self.implicit or id(optimizer) not in self._optimizer_ids:
            return
        if not self._boundary.in_step or self._boundary.disabled:
            return
        self._tell_players()
        self._stepped.add(id(optimizer))
        if len(self._stepped) == len(self._optimizer_ids):
            self._end(begin_next=True)

    def after_scaler_step(self, optimizer: Any) -> None:
        """``GradScaler.step`` returned: an update it skipped (an inf) still ends the step."""
        if (
            self.implicit
            and self.backward_seen
            and id(optimizer) in self._optimizer_ids
            and id(optimizer) not in self._stepped
            and self._boundary.in_step
        ):
            self._boundary.gradients_final()  # as they are: the record shows the inf
            self.after_optimizer_step(optimizer)

    # --- pieces -------------------------------------------------------------------------

    def _begin(self) -> None:
        self._stop_waiting()
        self.implicit = True
        self._stepped.clear()
        self._loss = None
        self._loss_fixed = False
        self.backward_seen = False
        self._boundary.begin_inferred()

    def _end(self, *, begin_next: bool) -> None:
        """End the inferred step (its loss filed unless logged), and begin the next."""
        if self._evaluation is not None:
            self._evaluation.finish()
        step = self._measurer.current
        loss, self._loss = self._loss, None
        logged = step is None or LOSS in step.tensor_scalars or LOSS in step.float_scalars
        if step is not None and loss is not None and not logged:
            step.tensor_scalars[LOSS] = loss
        self._boundary.flush_last()  # (the step before, if no backward sent it)
        self._boundary.end_step()
        self.implicit = False
        self._ended += 1
        if self.holding and self._ended >= UNBRACKETED_UPDATES:
            self._release()
        if begin_next and self.active and not self._boundary.closed:
            self._begin()

    def _stop_waiting(self) -> None:
        if self._first_forward is not None:
            self._first_forward.remove()
            self._first_forward = None

    def _release(self) -> None:
        """Inference is confirmed (or the probe closes): the held steps go out."""
        if not self.holding:
            return
        self.holding = False
        held, self._held = self._held, []
        for record in held:
            self._boundary.send_now(record)

    def _first_grad_holder(self) -> torch.Tensor | None:
        """The parameter whose gradient tells whether a backward reached the model."""
        for param in self._layer_firsts:
            if param.grad is not None:
                return param
        return self._layer_firsts[0] if self._layer_firsts else None

    def _updated_by_hand(self) -> bool:
        """Since the last backward, did a parameter move or the first gradient clear?"""
        noted = self._after_backward
        if noted is None:
            return False
        versions, grad, version = noted
        if any(p._version != v for p, v in zip(self._layer_firsts, versions, strict=True)):
            return True
        first = self._first_grad_holder()
        now = None if first is None else first.grad
        return now is not grad or (now is not None and now._version != version)

    def adopt(self, tensors: Any) -> None:
        """This probe was made just after a backward (``traintop run``, a hand-written
        update): that backward is its step 0's."""
        if self.active and not self._boundary.in_step:
            self._begin()
            self._mark = None
            self.after_backward(tensors)


def forward_begins(module: torch.nn.Module, args: Any) -> None:
    """A forward of ``module`` began before the probes made in it could hook it
    (``probes.attach``): step 0 of theirs begins there."""
    for watcher in _active():
        if watcher._first_forward is not None:
            _safely(watcher, watcher._forward_begins, module, args)


def adopt_backward(tensors: Any) -> None:
    """The probes made just after a backward take it as their step 0's (``probes.attach``)."""
    for watcher in _active():
        _safely(watcher, watcher.adopt, tensors)


# --- the patches, installed while a probe infers its steps --------------------------------

_lock = threading.Lock()
_watchers: list[weakref.ref[InferredSteps]] = []
_held = Held()  # the patches, while any probe infers its steps


def _active() -> list[InferredSteps]:
    found = []
    for ref in _watchers:
        watcher = ref()
        if watcher is not None and watcher.active:
            found.append(watcher)
    return found


def _backward(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    watchers = _active() if _watchers else []
    if not watchers:
        return proceed(*args, **kwargs)
    tensors = args[0] if args else kwargs.get("tensors")
    for watcher in watchers:
        _safely(watcher, watcher.before_backward)
    result = proceed(*args, **kwargs)
    for watcher in watchers:
        _safely(watcher, watcher.after_backward, tensors)
    if len(watchers) > 1:
        reached = [w for w in watchers if w.reached]
        for watcher in reached if len(reached) > 1 else ():
            _safely(watcher, watcher.shared, [w for w in reached if w is not watcher])
    return result


def _scaler_step(
    proceed: Callable[..., Any], self: GradScaler, optimizer: Any, *args: Any, **kwargs: Any
) -> Any:
    result = proceed(self, optimizer, *args, **kwargs)
    for watcher in _active():
        _safely(watcher, watcher.after_scaler_step, optimizer)
    return result


def _after_any_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if not _watchers:  # (every optimizer's every step: no probe infers now)
        return
    for watcher in _active():
        _safely(watcher, watcher.after_optimizer_step, optimizer)


def _safely(watcher: InferredSteps, call: Callable[..., None], *args: Any) -> None:
    """A failure inside the probe switches it off; it never reaches training."""
    try:
        call(*args)
    except Exception as exc:
        watcher.active = False
        watcher._fail(exc)


def _install(watcher: InferredSteps) -> None:
    with _lock:
        _watchers[:] = [r for r in _watchers if r() is not None]
        _watchers.append(weakref.ref(watcher))
        if not _held:
            _held.hold(OPTIMIZER_STEP_POST_HOOK, Layer("autostep", _after_any_step))
            _held.hold(BACKWARD, Layer("autostep", _backward, order=30))
            _held.hold(SCALER_STEP, Layer("autostep", _scaler_step))


def _forget(watcher: InferredSteps) -> None:
    """``watcher`` infers no more: the patches skip it (they stay installed)."""
    with _lock:
        _watchers[:] = [r for r in _watchers if r() is not None and r() is not watcher]


def _uninstall(watcher: InferredSteps) -> None:
    """The last watcher gone takes the patches away (``probes.runtime.patches.patches``)."""
    with _lock:
        _watchers[:] = [r for r in _watchers if r() is not None and r() is not watcher]
        if not _watchers:
            _held.release()
