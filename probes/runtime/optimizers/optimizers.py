"""Several optimizers in one run (a GAN's generator and discriminator, an encoder and a
head at other settings), watched as one.

``watch(model, [opt_g, opt_d])`` (or a tuple; wrappers of optimizers are unwrapped
one by one) hands the probe an ``OptimizerSet``: to the probe's parts it is one
optimizer whose param groups are every optimizer's, in order (learning rates, the
guard's skip, the LR experiment, the wiring checks read them all) and whose step hooks
are registered on each optimizer. A step of the probe is then whatever runs between
its boundaries, every optimizer's ``step()`` in it.

What each optimizer steps is read where its own gradients are final
(``PerOptimizerReads``): the gradients of the parameters an optimizer holds are those
read before its own ``step()`` (in the canonical GAN loop the generator's backward
adds into the discriminator's gradients after the discriminator stepped, and a
generator read before then would be the last step's), and its parameters' updates are
those its own ``step()`` made. The update check (which layers no step touched) is the
optimizer hooks' own: a layer counts as stepped when any optimizer of the step moved it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from probes.runtime.measure.layers import LayerMap
from probes.runtime.measure.stats import Measurement, compose_order
from probes.runtime.optimizers.clearing import ClearingWatch
from probes.runtime.patches.hooks import unwrap_optimizer


class _Handles(RemovableHandle):
    """One handle for a hook registered on each optimizer of a set."""

    def __init__(self, handles: list[RemovableHandle]) -> None:  # (no torch registry)
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class OptimizerSet(torch.optim.Optimizer):
    """Several optimizers, seen by the probe as one (see the module).

    Not an optimizer to step: the training loop steps its own optimizers, and the hooks
    registered here run on each of them. Like accelerate's wrapper, it subclasses
    ``Optimizer`` without running its ``__init__``.

    Args:
        optimizers: the real optimizers (unwrapped), two or more.
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = tuple(optimizers)
        self.defaults: dict[str, Any] = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Every optimizer's param groups, in order (the same dicts: a change sticks)."""
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        return _Handles([o.register_step_pre_hook(hook) for o in self.optimizers])

    def register_step_post_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        return _Handles([o.register_step_post_hook(hook) for o in self.optimizers])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none)

    def step(self, closure: Any = None) -> Any:
        raise TypeError("an OptimizerSet is watched, not stepped: step each optimizer")

    def __repr__(self) -> str:
        return f"OptimizerSet({', '.join(type(o).__name__ for o in self.optimizers)})"


def optimizer_of(optimizer: object) -> torch.optim.Optimizer | None:
    """What ``watch()``'s second argument stands for: None, one real optimizer, or an
    ``OptimizerSet`` of several (a list or tuple of optimizers or their wrappers).

    Raises:
        TypeError: it is none of these (``unwrap_optimizer`` says what was expected).
    """
    if isinstance(optimizer, list | tuple) and optimizer and not _all_tensors(optimizer):
        real = [unwrap_optimizer(o) for o in optimizer]
        optimizers = [o for o in dict.fromkeys(real) if o is not None]  # each once
        if len(optimizers) == 1:
            return optimizers[0]
        return OptimizerSet(optimizers) if optimizers else None
    return unwrap_optimizer(optimizer)


def _all_tensors(items: Sequence[object]) -> bool:
    """A list of parameters given where the optimizer goes (said as such by unwrap)."""
    return all(isinstance(item, torch.Tensor | dict) for item in items)


def optimizer_name(optimizer: torch.optim.Optimizer | None) -> str | None:
    """The optimizer's class for the hello: ``Adam``; a set's ``Adam`` when all are
    Adam, else ``Adam+SGD``."""
    if optimizer is None:
        return None
    if isinstance(optimizer, OptimizerSet):
        names = list(dict.fromkeys(type(o).__name__ for o in optimizer.optimizers))
        return "+".join(names)
    # the real optimizer's class (an accelerate or Lightning wrapper's inner one): the
    # monitor's update-ratio band depends on it (adaptive optimizers differ)
    return type(unwrap_optimizer(optimizer)).__name__


class PerOptimizerReads:
    """Each parameter's gradient norm and update, from its own optimizer's step.

    The measurer reads the gradients once a step, at the first optimizer's step; after
    each optimizer's ``step()`` the norms of that optimizer's parameters are kept and
    the next read is made afresh (where the next optimizer's gradients are final). The
    measurer calls ``merge_reads`` after each read and ``merge_updates`` after each
    update it measures; each makes the step's lists the kept values joined with the
    new ones for the other parameters.

    Args:
        optimizers: the set's optimizers.
        layers: the model's layers and trainable parameters.
        current: the step being measured, if any (the measurer's ``current``).
        on_error: called with an exception raised in a hook of ours (the probe's
            switch-off); nothing is raised into ``optimizer.step()``.
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        layers: LayerMap,
        current: Callable[[], Measurement | None],
        on_error: Callable[[Exception], None] = lambda exc: None,
    ) -> None:
        self._on_error = on_error  # nothing of ours raises into optimizer.step()
        self._failed: Exception | None = None  # raised in a post-hook, not said yet
        owners: dict[int, int] = {}
        for index, optimizer in enumerate(optimizers):
            for group in optimizer.param_groups:
                for param in group["params"]:
                    owners.setdefault(id(param), index)
        #: per watched parameter, the optimizer that holds it (None: none does)
        self.owner = [owners.get(id(p)) for p in layers.params]
        self._count = len(layers.params)
        self._current = current
        self._step: Measurement | None = None
        self._grads: dict[int, torch.Tensor] = {}  # parameter -> its kept gradient norm
        self._updates: dict[int, torch.Tensor] = {}  # update_order index -> kept norm
        self._stepping: int | None = None  # the optimizer whose step() ran last
        self.spent = 0.0  # seconds in its hooks on each optimizer: the probe's own time
        firsts = _first_params(layers)
        # per optimizer, the layers whose first parameter it holds
        self._layers = [
            [layer for layer, first in enumerate(firsts) if self.owner[first] == index]
            for index in range(len(optimizers))
        ]
        self._layer_params = [[layers.params[firsts[i]] for i in of] for of in self._layers]
        # Per optimizer, the clearing watch of its own layers: their passes as its step
        # sees them (the measurer's watch takes one layer's gradient as the sign that all
        # were cleared: under several optimizers each clears its own). Unhooked until
        # ``check_clearing`` turns the check on: without the check no hook of theirs is
        # worth a call a backward pass (passes from the versions alone).
        self._check = False
        self._clearings = [
            ClearingWatch(params, on_error=on_error, hooked=False) for params in self._layer_params
        ]
        self._passes: dict[int, int | None] = {}  # layer -> its passes at its optimizer's step

    def check_clearing(self) -> list[ClearingWatch]:
        """Check each optimizer's own gradients were cleared since its last step (its
        watch hooked on one of its parameters); the watches (their hooks' time is the
        probe's own)."""
        self._check = True
        self._clearings = [
            ClearingWatch(params, on_error=self._on_error) for params in self._layer_params
        ]
        return self._clearings

    def remove(self) -> None:
        """Remove its clearing watches' hooks (idempotent; those on the optimizers are
        ``OptimizerHooks``', removed with the rest)."""
        for clearing in self._clearings:
            clearing.remove()

    def _of(self, step: Measurement) -> None:
        if self._step is not step:  # a new step: nothing kept yet
            self._step, self._grads, self._updates, self._passes = step, {}, {}, {}

    def before(self, index: int) -> Callable[..., None]:
        """The hook before optimizer ``index``'s step (``OptimizerHooks.add_each``)."""

        def before(optimizer: Any, args: Any, kwargs: Any) -> None:
            started = perf_counter()
            if self._failed is not None:  # (said here, not where torch iterates post-hooks)
                failed, self._failed = self._failed, None
                self._on_error(failed)
            try:
                self._stepping = index
                step = self._current()
                if step is not None:
                    self._of(step)
                clearing = self._clearings[index]
                uncleared = clearing.take_uncleared()
                for layer, passes in zip(self._layers[index], clearing.count_passes(), strict=True):
                    self._passes[layer] = passes
                if uncleared and step is not None:
                    step.not_cleared = True
                if clearing.discarded and step is not None:
                    step.layer_values["discarded_grads"] = True  # (a game: a GAN's players)
            except Exception as exc:
                self._on_error(exc)
            self.spent += perf_counter() - started

        return before

    def after(self, index: int) -> Callable[..., None]:
        """The hook after optimizer ``index``'s step."""

        def after(optimizer: Any, args: Any, kwargs: Any) -> None:
            started = perf_counter()
            try:
                if self._check:  # (the next pass must find its gradient cleared)
                    self._clearings[index].updated()
                self._keep(index)
            except Exception as exc:
                # Switching off removes post-hooks, and torch is iterating them now:
                # the next optimizer step says it.
                self._failed = exc
            self.spent += perf_counter() - started

        return after

    def _keep(self, index: int) -> None:
        """Optimizer ``index`` stepped: keep its parameters' norms and passes; the next
        optimizer's gradients are read afresh, where they are final."""
        step = self._current()
        if step is None:
            return
        self._of(step)
        self._write_passes(step)
        if not step.grads_read:
            return
        owner = self.owner
        for param, norm in zip(self._indices(step), step.grad_norms, strict=True):
            if owner[param] == index:
                self._grads[param] = norm
        step.grads_read = False

    def _write_passes(self, step: Measurement) -> None:
        passes = step.layer_values.get("backward_passes")
        if passes is not None:
            for layer, count in self._passes.items():
                passes[layer] = count

    def _indices(self, step: Measurement) -> tuple[int, ...] | range:
        indices = compose_order(step.grad_present, step.grad_order)
        return range(len(step.grad_norms)) if indices is None else indices

    def merge_reads(self, step: Measurement) -> None:
        """After a read: the kept norms of the optimizers that stepped replace the new."""
        self._of(step)
        if not self._grads:
            return
        norms = dict(zip(self._indices(step), step.grad_norms, strict=True))
        norms.update(self._grads)
        order = tuple(sorted(norms))
        step.grad_norms = [norms[i] for i in order]
        step.grad_order, step.grad_present = order, None
        step.none_grads = self._count - len(order)

    def merge_updates(self, step: Measurement) -> None:
        """After an update was measured: keep what the optimizer that stepped moved (its
        parameters' changes and weights); the step's update is every one kept."""
        if step.update_norms is None:
            return
        self._of(step)
        count, stepping, owner = self._count, self._stepping, self.owner
        order = step.update_order or range(2 * count)
        for index, norm in zip(order, step.update_norms, strict=True):
            param_owner = owner[index % count]
            if param_owner is None or param_owner == stepping or stepping is None:
                self._updates[index] = norm
        kept = tuple(sorted(self._updates))
        step.update_norms = [self._updates[i] for i in kept]
        step.update_order = kept


class MergingMeasurer(Protocol):
    """What ``attach`` sets on the measurer: where it calls the merges, and its step."""

    current: Measurement | None
    check_clearing: bool
    hook_clocks: list[Any]  # whose ``spent`` (seconds in hooks) it adds to a step's
    merge_reads: Callable[[Measurement], None] | None
    merge_updates: Callable[[Measurement], None] | None


class EachOptimizerHooks(Protocol):
    """The owner of every hook on the optimizers (``OptimizerHooks``)."""

    optimizer: torch.optim.Optimizer | None

    def add_each(
        self,
        before: Callable[[int], Callable[..., None]],
        after: Callable[[int], Callable[..., None]],
    ) -> None: ...


def attach(
    hooks: EachOptimizerHooks,
    layers: LayerMap,
    measurer: MergingMeasurer,
    on_error: Callable[[Exception], None],
) -> PerOptimizerReads | None:
    """Under an ``OptimizerSet`` (``hooks.optimizer``), read each optimizer's parameters
    at its own step (the measurer calls the merges; ``hooks`` hooks each optimizer);
    None for one optimizer or none."""
    optimizer = hooks.optimizer
    if not isinstance(optimizer, OptimizerSet) or not layers.params:
        return None
    reads = PerOptimizerReads(optimizer.optimizers, layers, lambda: measurer.current, on_error)
    hooks.add_each(reads.before, reads.after)
    measurer.merge_reads, measurer.merge_updates = reads.merge_reads, reads.merge_updates
    # One note for the whole step would compare one optimizer's gradient with another's
    # step (a GAN's generator backward adds into the discriminator's after it stepped).
    if measurer.check_clearing:
        measurer.hook_clocks.extend(reads.check_clearing())
    measurer.check_clearing = False
    measurer.hook_clocks.append(reads)
    return reads


def detach(reads: PerOptimizerReads | None) -> None:
    """Remove what ``attach`` hooked (None: nothing was)."""
    if reads is not None:
        reads.remove()


def _first_params(layers: LayerMap) -> list[int]:
    """Each layer's first parameter."""
    firsts: dict[int, int] = {}
    for index, layer in enumerate(layers.param_layer):
        firsts.setdefault(layer, index)
    return [firsts[layer] for layer in range(len(layers.names))]
