"""Evaluations found in a loop watched with no step API (``probes.runtime.autostep``).

While steps are inferred, a forward pre-hook on the watched model (removed once the step
API is used, and at close) sees each forward: one with the model in eval mode or with
gradients off (``no_grad``, ``inference_mode``) begins an evaluation
(``Probe.begin_evaluation``: the eval-mode checks hook the model's layers from there
on), and the next training forward, backward or ``optimizer.step()`` ends it. A
forward in train mode under ``no_grad`` is the bug the eval-mode check names, so it
counts as an evaluation too.

While such a probe is open, the loss functions of ``torch.nn.functional`` (the ``nn``
loss modules call them) have stand-ins (``probes.runtime.patches``), from the probe's
start, since ``F.cross_entropy(model(x), y)`` looks the function up before the forward
that opens the evaluation: each one-element loss they return while an evaluation is
open joins its ``val_loss``, the mean over the calls, detached (no sync). A loss
computed by hand (``(out - y).pow(2).mean()``) is not seen, nor, with ``watch()``, a
function imported by name before the probe was made (``from torch.nn.functional import
cross_entropy``); under ``traintop run`` the stand-ins are there from torch's import.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from probes.runtime import seams
from probes.runtime.hooks import EntryHandle, eager, entry_pre_hook
from probes.runtime.patches import REGISTRY, Layer, Seam

#: The loss functions watched during an inferred evaluation.
LOSSES = (
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
)
VALIDATION_LOSS = "val_loss"

_open: list[InferredEvaluation] = []  # evaluations taking losses now


def _gone() -> None:
    return None


class ForwardHook:
    """The pre-hook on the watched model. ``copy.deepcopy(model)`` (an EMA twin) and
    ``torch.save(model)`` take a model's hooks along: a bound method would take the
    probe (its threads and locks) and fail. This one is copied, and pickled, as an inert
    stand-in; and it only hears its own model's forwards."""

    def __init__(self, owner: InferredEvaluation, module: torch.nn.Module) -> None:
        self._owner: Callable[[], InferredEvaluation | None] = weakref.ref(owner)
        self._module: Callable[[], torch.nn.Module | None] = weakref.ref(module)

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        owner = self._owner()
        if owner is not None and module is self._module():
            owner._forward(module, args)

    def __reduce__(self) -> tuple[Callable[[], ForwardHook], tuple[()]]:
        return ForwardHook.inert, ()

    @staticmethod
    def inert() -> ForwardHook:
        """A hook that does nothing (what a copy of the model carries)."""
        hook = object.__new__(ForwardHook)
        hook._owner = hook._module = _gone
        return hook


class InferredEvaluation:
    """The watched model's evaluations, found (see the module).

    Args:
        module: the watched model, unwrapped.
        begin: opens an evaluation (``Probe.begin_evaluation``); False if none opened.
        end: ends it with its scalars (``Probe.end_evaluation``).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        begin: Callable[[], bool],
        end: Callable[..., None],
    ) -> None:
        self._begin, self._end = begin, end
        self.open = False
        self._sum: torch.Tensor | None = None
        self._count = 0
        hook = ForwardHook(self, module)
        # Where the model is entered, outside any compiled region (a hook traced there
        # would break the graph: ``probes.runtime.hooks``).
        self._handle: EntryHandle | None = entry_pre_hook(module, eager(hook))
        # On from the start, not from the evaluation's first forward: in
        # ``F.cross_entropy(model(x), y)`` the function is looked up before the forward.
        _watch_losses()

    def _forward(self, module: torch.nn.Module, args: Any) -> None:
        evaluating = not module.training or not torch.is_grad_enabled()
        if evaluating and not self.open:
            if self._begin():
                self.open = True
                self._sum, self._count = None, 0
                _start(self)
        elif not evaluating and self.open:
            self.finish()

    def add_loss(self, loss: torch.Tensor) -> None:
        loss = loss.detach()
        self._sum = loss if self._sum is None else self._sum + loss
        self._count += 1

    def finish(self) -> None:
        """The evaluation (if one is open) ends: its record, with the mean loss."""
        if not self.open:
            return
        self.open = False
        _stop(self)
        total, self._sum = self._sum, None
        if total is not None:
            self._end(**{VALIDATION_LOSS: total / self._count})
        else:
            self._end()

    def remove(self) -> None:
        """No more evaluations found (the step API took over, or the probe closes)."""
        self.finish()
        if self._handle is not None:  # (once: the losses' hold goes with the hook)
            self._handle.remove()
            self._handle = None
            _unwatch_losses()


def _taking(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A loss function's layer: its result joins each open evaluation's loss."""
    result = proceed(*args, **kwargs)
    # Traced by dynamo as a constant: a compiled loss is left whole, nothing guarded.
    if (
        not torch.compiler.is_compiling()
        and _open
        and isinstance(result, torch.Tensor)
        and result.numel() == 1
    ):
        for evaluation in _open:
            evaluation.add_loss(result)
    return result


_LAYER = Layer("evaluation losses", _taking)


def _watch_losses() -> None:
    """The loss functions' layer is on while any found evaluation watches (the registry
    counts them; ``_unwatch_losses`` undoes one)."""
    for seam in _loss_seams():
        REGISTRY.add(seam, _LAYER)


def _unwatch_losses() -> None:
    for seam in _loss_seams():
        REGISTRY.remove(seam, _LAYER)


def hold_losses() -> None:
    """Give the loss functions their stand-ins for the rest of the process (``traintop
    run``, at torch's import: a function the script imports by name is the stand-in)."""
    for seam in _loss_seams():
        REGISTRY.add(seam, _PROCESS_LAYER)


def _passing(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return proceed(*args, **kwargs)


#: Holds the stand-ins in place for the process; the probes' own layer comes and goes.
_PROCESS_LAYER = Layer("evaluation losses (traintop run)", _passing)


def _loss_seams() -> list[Seam]:
    return [seam for seam in map(seams.functional, LOSSES) if seam is not None]


def _start(evaluation: InferredEvaluation) -> None:
    _open.append(evaluation)


def _stop(evaluation: InferredEvaluation) -> None:
    if evaluation in _open:
        _open.remove(evaluation)
