"""Evaluations found in a loop watched with no step API (``probes.runtime.steps.autostep``).

While steps are inferred, a forward pre-hook on the watched model (removed once the step
API is used, and at close) sees each forward: one with the model in eval mode or with
gradients off (``no_grad``, ``inference_mode``) begins an evaluation
(``Probe.begin_evaluation``: the eval-mode checks hook the model's layers from there
on), and the next training forward, backward, ``optimizer.step()`` or loss with
gradients (the model in train mode) ends it. A forward in train mode under ``no_grad``
is the bug the eval-mode check names, so it counts as an evaluation too, if a loss
judges its outputs or the script logs in it: one that nothing judges is sampling (a
GAN's fixed noise drawn for its image grid, ``generate()``), not an evaluation, and
sends no record. (An evaluation that computes only a metric by hand, ``argmax`` against
the labels, is taken for sampling too: ``probe.evaluate()`` declares it.)

While such a probe is open, the loss functions of ``torch.nn.functional`` (the ``nn``
loss modules call them) have stand-ins (``probes.runtime.patches.patches``), from the probe's
start, since ``F.cross_entropy(model(x), y)`` looks the function up before the forward
that opens the evaluation. Each one-element loss they return while an evaluation is
open is reduced as a script reduces it (``_reduced``): the sum it stands for and its
number of terms (the targets not ignored for a classification loss, the elements for
a regression, the rows for ``kl_div``'s ``batchmean``), a ``mean`` taken times its
terms, a ``sum`` as it is. The evaluation's loss is then the sums' total over the
terms' total: ``test_loss += F.nll_loss(out, y, reduction="sum").item()`` over a
loader, divided by ``len(dataset)`` (pytorch/examples' MNIST) is that number; so is a
batch mean weighted by the batch's size (a mean of means differs by a short last
batch). The sums stay detached tensors on the loss's device, read when the record is
made (no sync per batch).

**Splits.** The k-th loss after each forward of the model belongs to series k: a loader
loop's one loss a batch is one series; one full-graph forward followed by a loss on
each of the train, val and test masks (a GCN or GAT) is three, never averaged into a
number the script does not print. Each series is named from the line that called its
loss (read once per call site, ``linecache``, never run): a line that names one split
(``idx_val``, ``data.test_mask``, ``loss_train = ...``) names it ``train_loss``,
``val_loss`` or ``test_loss``; else ``val_loss[k]``. The validation loss (``val_loss``,
the one the screen draws and the overfitting rule reads) is the series named for
validation, else the first unnamed one, else the test split, else the first: the
first is what every loader loop has, and it is the series a script adds others after.
A loss the script logs itself in the evaluation (``probe.log(val_loss=...)``) wins:
then none of these is filed.

Not seen: a loss computed by hand (``(out - y).pow(2).mean()``), a loss of several
elements (``reduction="none"``, summed by the script), nor, with ``watch()``, a
function imported by name before the probe was made (``from torch.nn.functional import
cross_entropy``); under ``traintop run`` the stand-ins are there from torch's import.
Two loaders evaluated one after the other with no training between are one evaluation
(one series: nothing marks where one loader ends).
"""

from __future__ import annotations

import functools
import inspect
import linecache
import math
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from types import CodeType, FrameType
from typing import Any

import torch

from probes.runtime.patches import seams
from probes.runtime.patches.hooks import EntryHandle, eager, entry_pre_hook
from probes.runtime.patches.patches import REGISTRY, Layer, Seam

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
#: The losses whose terms are their targets (class indices: those not ignored).
CLASSIFICATION = ("cross_entropy", "nll_loss")

_open: list[InferredEvaluation] = []  # evaluations taking losses now

Terms = int | torch.Tensor  # a count, or a device tensor of one (targets not ignored)


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


class Split:
    """One series of an evaluation: the k-th loss after each forward (see the module)."""

    __slots__ = ("broken", "label", "terms", "total")

    def __init__(self, label: str | None) -> None:
        self.label = label  # "train", "val", "test" (its call sites' words) or None
        self.total: torch.Tensor | None = None  # the sums, float64 (detached)
        self.terms: Terms = 0
        self.broken = False  # a sum that could not be added (two devices): not filed

    def add(self, value: torch.Tensor, terms: Terms, label: str | None) -> None:
        if label != self.label:  # call sites that disagree name no split
            self.label = None
        try:
            self.total = value if self.total is None else self.total + value
            self.terms = self.terms + terms
        except Exception:
            self.broken = True

    def loss(self) -> torch.Tensor | None:
        """The series' loss: Σ sums / Σ terms (a device tensor: read with the record)."""
        if self.broken or self.total is None:
            return None
        return self.total / self.terms


class InferredEvaluation:
    """The watched model's evaluations, found (see the module).

    Args:
        module: the watched model, unwrapped.
        begin: opens an evaluation (``Probe.begin_evaluation``); False if none opened.
        end: ends it with its losses by name (what the script logged wins over them).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        begin: Callable[[], bool],
        end: Callable[[dict[str, torch.Tensor]], None],
    ) -> None:
        self._begin, self._end = begin, end
        self._module: Callable[[], torch.nn.Module | None] = weakref.ref(module)
        self.open = False
        self._splits: list[Split] = []
        self._after_forward = 0  # losses since the latest forward: the next one's split
        hook = ForwardHook(self, module)
        # Where the model is entered, outside any compiled region (a hook traced there
        # would break the graph: ``probes.runtime.patches.hooks``).
        self._handle: EntryHandle | None = entry_pre_hook(module, eager(hook))
        # On from the start, not from the evaluation's first forward: in
        # ``F.cross_entropy(model(x), y)`` the function is looked up before the forward.
        _watch_losses()

    def _forward(self, module: torch.nn.Module, args: Any) -> None:
        evaluating = not module.training or not torch.is_grad_enabled()
        if evaluating and not self.open:
            if self._begin():
                self.open = True
                self._splits, self._after_forward = [], 0
                _start(self)
        elif not evaluating and self.open:
            self.finish()
        else:
            self._after_forward = 0  # the next loss is the first of this forward's

    def model_training(self) -> bool:
        """Is the watched model in training mode? A loss with gradients then, after an
        evaluation opened by ``no_grad`` alone, is training again (a GAN's D stepping
        after G sampled its fixed noise): it ends the evaluation, it is not its loss."""
        module = self._module()
        return module is not None and module.training

    def add_loss(self, value: torch.Tensor, terms: Terms = 1, label: str | None = None) -> None:
        """One loss call: ``value``, the sum over its ``terms`` (``_reduced``), joins the
        series of its place after the latest forward."""
        index = self._after_forward
        self._after_forward += 1
        if index == len(self._splits):
            self._splits.append(Split(label))
        self._splits[index].add(value, terms, label)

    def finish(self) -> None:
        """The evaluation (if one is open) ends: its record, with each series' loss."""
        if not self.open:
            return
        self.open = False
        _stop(self)
        splits, self._splits = self._splits, []
        losses = {}
        for name, split in zip(series_names([s.label for s in splits]), splits, strict=True):
            loss = split.loss()
            if loss is not None:
                losses[name] = loss
        self._end(losses)

    def remove(self) -> None:
        """No more evaluations found (the step API took over, or the probe closes)."""
        self.finish()
        if self._handle is not None:  # (once: the losses' hold goes with the hook)
            self._handle.remove()
            self._handle = None
            _unwatch_losses()


#: Which series is the validation loss: named for validation, else unnamed, else test.
_PREFERENCE = {"val": 0, None: 1, "test": 2, "train": 3}


def series_names(labels: list[str | None]) -> list[str]:
    """The names of an evaluation's series from their call sites' labels (see the
    module): one ``val_loss`` (the validation loss), the others ``train_loss`` or
    ``test_loss`` where their label is theirs alone, else ``val_loss[k]``.

    Example::

        >>> series_names([None, None, None])
        ['val_loss', 'val_loss[1]', 'val_loss[2]']
        >>> series_names(["train", "val", "test"])
        ['train_loss', 'val_loss', 'test_loss']
    """
    if not labels:
        return []
    main = min(range(len(labels)), key=lambda k: (_PREFERENCE.get(labels[k], 1), k))
    names = []
    for k, label in enumerate(labels):
        if k == main:
            names.append(VALIDATION_LOSS)
        elif label is not None and label != "val" and labels.count(label) == 1:
            names.append(f"{label}_loss")
        else:
            names.append(f"{VALIDATION_LOSS}[{k}]")
    return names


# --- each loss call -------------------------------------------------------------------

_calls = threading.local()  # depth: a loss called inside one (a __torch_function__'s)


def _taking(name: str, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A loss function's layer: its result joins each open evaluation's loss."""
    # Traced by dynamo as a constant: a compiled loss is left whole, nothing guarded.
    if torch.compiler.is_compiling() or not _open:
        return proceed(*args, **kwargs)
    depth = getattr(_calls, "depth", 0)
    _calls.depth = depth + 1
    try:
        result = proceed(*args, **kwargs)
    finally:
        _calls.depth = depth
    if depth == 0 and isinstance(result, torch.Tensor) and result.numel() == 1:
        _note(name, args, kwargs, result)
    return result


def _note(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: torch.Tensor) -> None:
    """The call's loss joins each open evaluation (never raises into the script's call)."""
    try:
        try:
            value, terms = _reduced(name, _bound(name, args, kwargs), result)
        except Exception:  # an argument of a kind not foreseen: the call weighs one
            value, terms = _detached(result), 1
        label = _call_site_label()
        training = torch.is_grad_enabled() and result.requires_grad
        for evaluation in list(_open):
            if training and evaluation.model_training():
                evaluation.finish()  # training again: this loss is not the evaluation's
            else:
                evaluation.add_loss(value, terms, label)
    except Exception:
        return


def _reduced(
    name: str, bound: Mapping[str, Any], result: torch.Tensor
) -> tuple[torch.Tensor, Terms]:
    """The sum a loss call stands for and its number of terms, as device values (no
    sync): a ``mean`` times its terms, a ``sum`` (and a one-element ``none``) as it is."""
    reduction = _reduction(bound)
    value = _detached(result)
    if reduction == "none":
        return value, 1
    terms = _terms(name, bound, reduction)
    if reduction in ("mean", "batchmean", "elementwise_mean"):
        if isinstance(terms, torch.Tensor):  # (a mean over no target at all is NaN)
            return torch.where(terms > 0, value * terms, 0.0), terms
        return value * terms, terms
    return value, terms


def _reduction(bound: Mapping[str, Any]) -> str:
    size_average, reduce = bound.get("size_average"), bound.get("reduce")
    if size_average is not None or reduce is not None:  # torch's legacy arguments
        return torch.nn._reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    return str(bound.get("reduction", "mean"))


def _terms(name: str, bound: Mapping[str, Any], reduction: str) -> Terms:
    """How many loss terms the call reduced: what its mean divides by (see the module)."""
    input, target = bound.get("input"), bound.get("target")
    if name in CLASSIFICATION and isinstance(target, torch.Tensor):
        if not target.is_floating_point():  # class indices; those ignored are no term
            return (target != bound.get("ignore_index", -100)).sum()
        if isinstance(input, torch.Tensor) and input.dim() >= 2:  # class probabilities
            return input.numel() // max(input.shape[1], 1)
        return 1
    if name == "kl_div" and reduction in ("batchmean", "sum") and isinstance(input, torch.Tensor):
        return input.shape[0] if input.dim() else 1
    shapes = [t.shape for t in (input, target) if isinstance(t, torch.Tensor)]
    return math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1


def _detached(result: torch.Tensor) -> torch.Tensor:
    """The loss off the graph, in a tensor of its own (a CUDA graph's output is
    overwritten by its next replay), in float64 as a script's ``.item()`` adds it
    (float32 on MPS, which has no float64)."""
    dtype = torch.float32 if result.device.type == "mps" else torch.float64
    return result.detach().reshape(()).to(dtype, copy=True)


@functools.cache
def _parameters(name: str) -> tuple[str, ...]:
    return tuple(inspect.signature(getattr(torch.nn.functional, name)).parameters)


def _bound(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(zip(_parameters(name), args, strict=False))
    bound.update(kwargs)
    return bound


# --- the call site's split --------------------------------------------------------------

#: Frames of these folders are not the script's (the ``nn`` loss modules, the layers).
_INSIDE = tuple(
    os.path.dirname(os.path.abspath(folder)) + os.sep
    for folder in (torch.__file__, os.path.dirname(__file__))  # torch/, probes/
)
_SPLIT_WORDS = re.compile(r"(?<![a-z])(train|training|val|valid|validation|test|testing)(?![a-z])")
_LABELS = {"training": "train", "valid": "val", "validation": "val", "testing": "test"}
_SITE_LINES = 8  # lines of one call read at most
_SITES_KEPT = 1024
_sites: dict[tuple[CodeType, int], str | None] = {}


def _call_site_label() -> str | None:
    """``train``, ``val`` or ``test`` when the script's line that called the loss names
    that split alone (``F.nll_loss(out[idx_val], y[idx_val])``), else None. Read once per
    call site (a line of the script's file, from ``linecache``), never run."""
    try:
        frame: FrameType | None = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
            frame = frame.f_back
        if frame is None:
            return None
        key = (frame.f_code, frame.f_lasti)
        if key not in _sites:
            if len(_sites) >= _SITES_KEPT:
                return None
            _sites[key] = _label_of(frame.f_code, frame.f_lasti, frame.f_lineno)
        return _sites[key]
    except Exception:
        return None


def _label_of(code: CodeType, at: int, line: int | None) -> str | None:
    first = last = line
    positions = getattr(code, "co_positions", None)  # (3.11: the call's whole span)
    if positions is not None:
        start, end = next((p[:2] for i, p in enumerate(positions()) if i == at // 2), (0, 0))
        if start and end:
            first, last = start, end
    if not first or not last:
        return None
    text = " ".join(
        linecache.getline(code.co_filename, n)
        for n in range(first, min(last, first + _SITE_LINES) + 1)
    )
    words = {_LABELS.get(word, word) for word in _SPLIT_WORDS.findall(text.lower())}
    return words.pop() if len(words) == 1 else None


# --- the layers on the loss functions --------------------------------------------------

_LAYERS = {name: Layer("evaluation losses", functools.partial(_taking, name)) for name in LOSSES}


def _watch_losses() -> None:
    """The loss functions' layers are on while any found evaluation watches (the
    registry counts them; ``_unwatch_losses`` undoes one)."""
    for name, seam in _loss_seams():
        REGISTRY.add(seam, _LAYERS[name])


def _unwatch_losses() -> None:
    for name, seam in _loss_seams():
        REGISTRY.remove(seam, _LAYERS[name])


def hold_losses() -> None:
    """Give the loss functions their stand-ins for the rest of the process (``traintop
    run``, at torch's import: a function the script imports by name is the stand-in)."""
    for _, seam in _loss_seams():
        REGISTRY.add(seam, _PROCESS_LAYER)


def _passing(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return proceed(*args, **kwargs)


#: Holds the stand-ins in place for the process; the probes' own layer comes and goes.
_PROCESS_LAYER = Layer("evaluation losses (traintop run)", _passing)


def _loss_seams() -> list[tuple[str, Seam]]:
    return [(name, seam) for name in LOSSES if (seam := seams.functional(name)) is not None]


def _start(evaluation: InferredEvaluation) -> None:
    _open.append(evaluation)


def _stop(evaluation: InferredEvaluation) -> None:
    if evaluation in _open:
        _open.remove(evaluation)
