"""Gradient accumulation whose losses were not divided: the evidence, without a value read.

Accumulating k micro-batches into one update is healthy when each loss is divided by k
(the update then uses the mean gradient); a loop that calls ``loss.backward()`` on each
micro-batch's mean loss as the loss function returned it updates with k times that
gradient (the sum of k means). The number k is whole and read from the run, and so is
the evidence for it:

- each ``backward()`` notes whether the tensor it was called on is a loss function's
  own *mean*: its autograd node is the loss op's (``NllLossBackward0`` for
  ``cross_entropy`` and ``nll_loss``, ``MseLossBackward0``, ...) with the mean
  reduction saved on it; ``loss / k`` is a division's node, a GradScaler's
  ``scale(loss)`` a multiplication's, label smoothing an addition's: not this;
- and the place in the user's code it was called from (the first frame outside torch
  and traintop);
- at each update (``take``), the passes since the last one are *undivided* when there
  were at least two, every one of them on a mean loss as returned, all from one line
  of code: a loop over micro-batches. Two losses summed by two calls (a GAN's
  discriminator on its real and its fake batch) come from two lines and are not this.

The same look at the loss nodes tells the loss's *reduction* on the run's first passes
(``reduction``): a loss summed over its elements (a VAE's ``reduction='sum'``, under
an addition of its terms) has gradients as large as its sum from the first step, its
own scale, where a mean loss that large says the data is in raw units.

The passes counted are those that added into the same gradient: a closure (LBFGS) that
clears before each of its backward passes has one a clear, and the clearing watch
(``probes.runtime.optimizers.clearing``) tells. Host bookkeeping only, on ``backward()`` alone (the
loss functions are not wrapped): one attribute read and one frame walk a pass.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from probes.runtime.patches import seams
from probes.runtime.patches.patches import REGISTRY, Layer

#: Autograd nodes of the loss ops that save their reduction (1: mean).
LOSS_NODES = frozenset(
    {
        "NllLossBackward0",
        "NllLoss2DBackward0",
        "MseLossBackward0",
        "SmoothL1LossBackward0",
        "HuberLossBackward0",
        "BinaryCrossEntropyBackward0",
        "BinaryCrossEntropyWithLogitsBackward0",
    }
)
_MEAN = 1  # torch's Reduction::Mean
#: Frames in these folders are not the user's (torch's ``Tensor.backward``, ours).
_NOT_USERS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
_MAX_FRAMES = 12  # how far up a backward call the user's frame is looked for
_REDUCTION_LOOKS = 3  # the run's first backward passes: its loss's reduction


def is_mean_loss(tensor: Any) -> bool:
    """Is ``tensor`` a loss function's mean, as it returned it (see the module)?"""
    node = getattr(tensor, "grad_fn", None)
    return (
        node is not None
        and type(node).__name__ in LOSS_NODES
        and getattr(node, "_saved_reduction", None) == _MEAN
    )


_REDUCTIONS = {1: "mean", 2: "sum"}
_NODES_SEEN = 32  # loss nodes are looked for among a backward's first nodes only


def loss_reduction(tensor: Any) -> str | None:
    """``"sum"`` if a loss op reached from ``tensor`` within its first nodes sums over
    its elements, ``"mean"`` if those found all average, None if none is found."""
    node = getattr(tensor, "grad_fn", None)
    queue, seen, found = [node], 0, None
    while queue and seen < _NODES_SEEN:
        node = queue.pop(0)
        if node is None:
            continue
        seen += 1
        if type(node).__name__ in LOSS_NODES:
            saved = getattr(node, "_saved_reduction", None)
            reduction = _REDUCTIONS.get(saved) if isinstance(saved, int) else None
            if reduction == "sum":
                return reduction
            found = reduction or found
            continue
        queue.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return found


def _users_line(frame: Any) -> tuple[str, int] | None:
    """The first frame outside torch and traintop, as (file, line)."""
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        name = frame.f_code.co_filename
        if not name.startswith(_NOT_USERS):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


class UndividedWatch:
    """The backward passes of one probe (see the module).

    Args:
        on_error: called with an exception raised inside a layer of ours.
    """

    def __init__(self, *, on_error: Callable[[Exception], None]) -> None:
        self._on_error = on_error
        self._passes = 0  # backward passes since the last update
        self._undivided = 0  # ... of them on a mean loss as returned
        self._line: tuple[str, int] | None = None  # the one place they came from
        self._one_line = True
        self._looks = _REDUCTION_LOOKS  # backward passes left to read the reduction on
        self.reduction: str | None = None  # the loss's, as first found
        self._layer = Layer("undivided accumulation", self._backward, order=80)
        REGISTRY.add(seams.BACKWARD, self._layer)
        self._installed = True

    def remove(self) -> None:
        """Take our layer off (the probe's close)."""
        if self._installed:
            self._installed = False
            REGISTRY.remove(seams.BACKWARD, self._layer)

    def _backward(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            self._note_pass(args[0] if args else kwargs.get("tensors"))
        except Exception as error:
            self._on_error(error)
        return proceed(*args, **kwargs)

    def _note_pass(self, tensors: Any) -> None:
        self._passes += 1
        if is_mean_loss(tensors):
            self._undivided += 1
        if self._looks:
            self._looks -= 1
            self.reduction = loss_reduction(tensors) or self.reduction
        line = _users_line(sys._getframe(2))
        if self._line is None:
            self._line = line
        elif line != self._line:
            self._one_line = False

    def take(self, accumulated: int) -> int:
        """At an update: k, the undivided passes that went into its gradient (0: none,
        or not the pattern); ``accumulated`` is the clearing watch's count of passes
        into the gradient since it was cleared. Starts the count over."""
        passes, undivided, one_line = self._passes, self._undivided, self._one_line
        self._passes = self._undivided = 0
        self._line = None
        self._one_line = True
        if 2 <= accumulated == passes == undivided and one_line:
            return passes
        return 0
