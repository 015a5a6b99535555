"""The evaluations' one watcher on ``torch.nn.functional``: its dropout functions and
its loss functions, each given a layer of the process's patch registry
(``probes.runtime.patches.patches``) while an evaluation needs it, the same stand-in
every time (a compiled evaluation is not recompiled).

**Dropout** (``DROPOUT_CALLS``). Dropout called as a function (``F.dropout(x, p)``,
whose ``training`` defaults to True) survives ``model.eval()``: while an evaluation
(``probes.runtime.evaluation.evaluation.EvalScope``) is open, the dropout functions
count their calls with ``training=True`` and ``p > 0`` (``dropout_train_calls``).

**Losses** (``watch_losses``, ``start``). Evaluations found in a loop
(``probes.runtime.evaluation.autoeval``) take the losses the script computes. While a
probe that finds evaluations is open, the loss functions of ``torch.nn.functional``
(the ``nn`` loss modules call them) have stand-ins, from the probe's start, since
``F.cross_entropy(model(x), y)`` looks the function up before the forward that opens
the evaluation. Each one-element loss they return while an evaluation is open is
reduced as a script reduces it (``_reduced``): the sum it stands for and its number of
terms (the targets not ignored for a classification loss, the elements for a
regression, the rows for ``kl_div``'s ``batchmean``), a ``mean`` taken times its terms,
a ``sum`` as it is. The evaluation's loss is then the sums' total over the terms'
total: ``test_loss += F.nll_loss(out, y, reduction="sum").item()`` over a loader,
divided by ``len(dataset)`` (pytorch/examples' MNIST) is that number; so is a batch
mean weighted by the batch's size (a mean of means differs by a short last batch). The
sums stay detached tensors on the loss's device, read when the record is made (no sync
per batch). The k-th loss after a forward belongs to the evaluation's k-th series; each
call's split is read from the line that called it (``call_site_label``).
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
from collections.abc import Callable, Mapping
from types import CodeType, FrameType
from typing import Any, Protocol

import torch

from probes.runtime.patches import seams
from probes.runtime.patches.hooks import eager
from probes.runtime.patches.patches import REGISTRY, Layer, Seam, Shared

#: The functions of ``torch.nn.functional`` whose ``training`` defaults to True (the
#: alpha dropouts default to False: a True there is written on purpose).
DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d")


class DropoutCounter(Protocol):
    """An open evaluation, as the dropout functions count into it."""

    dropout_train_calls: int


class _DropoutCalls:
    """The dropout functions of ``torch.nn.functional``, counted while any evaluation
    is open (one layer for all open scopes, across probes and threads; the registry
    gives each function the same stand-in every time)."""

    def __init__(self) -> None:
        layer = Layer("evaluation dropout", self._counting)
        self._open: Shared[DropoutCounter] = Shared(lambda: [(s, layer) for s in self._seams()])

    def open(self, scope: DropoutCounter) -> None:
        self._open.join(scope)

    def close(self, scope: DropoutCounter) -> None:
        self._open.leave(scope)

    @staticmethod
    def _seams() -> list[Seam]:
        return [seam for seam in map(seams.functional, DROPOUT_FUNCTIONS) if seam is not None]

    def _counting(
        self,
        proceed: Callable[..., torch.Tensor],
        input: torch.Tensor,
        p: float = 0.5,
        training: bool = True,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        # Traced by dynamo: a constant there, so a compiled graph is left whole.
        if training and p > 0 and not torch.compiler.is_compiling():
            self._note_eagerly()
        return proceed(input, p, training, *args, **kwargs)

    @functools.cached_property
    def _note_eagerly(self) -> Callable[[], None]:
        return eager(self._note)  # a count, never traced into a compiled graph

    def _note(self) -> None:
        for scope in self._open.members:
            scope.dropout_train_calls += 1


DROPOUT_CALLS = _DropoutCalls()


# --- the loss functions ------------------------------------------------------------------

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
#: The losses whose terms are their targets (class indices: those not ignored).
CLASSIFICATION = ("cross_entropy", "nll_loss")

Terms = int | torch.Tensor  # a count, or a device tensor of one (targets not ignored)


class LossTaker(Protocol):
    """A found evaluation, as the loss functions hand it each loss."""

    def model_training(self) -> bool: ...

    def add_loss(self, value: torch.Tensor, terms: Terms = 1, label: str | None = None) -> None: ...

    def finish(self) -> None: ...


_open: list[LossTaker] = []  # evaluations taking losses now


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
        label = call_site_label()
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


def call_site_label() -> str | None:
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


def watch_losses() -> None:
    """The loss functions' layers are on while any found evaluation watches (the
    registry counts them; ``unwatch_losses`` undoes one)."""
    for name, seam in _loss_seams():
        REGISTRY.add(seam, _LAYERS[name])


def unwatch_losses() -> None:
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


def start(evaluation: LossTaker) -> None:
    _open.append(evaluation)


def stop(evaluation: LossTaker) -> None:
    if evaluation in _open:
        _open.remove(evaluation)
