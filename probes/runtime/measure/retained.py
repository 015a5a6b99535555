"""Graphs kept across steps: the loss of an earlier step still part of a live autograd
graph (the PyTorch FAQ's ``total_loss += loss``, a list of losses kept for logging).

On a sampled step, the loss ``backward()`` runs from gets a marker in its autograd node's
``metadata`` dictionary (a dictionary torch keeps on the node for anomaly mode): the
marker lives exactly as long as the node. A step's graph has no use once its update is
done, so a node still alive two steps later is held by something of the loop's; the
record says how many sampled steps' losses are (``retained_graphs``) and the oldest
(``retained_origin``). Nothing is read from the graph, nothing is kept alive by the probe
(a weak reference to the marker), and the marker goes with the node.

Cost, on sampled steps only: one small object and one dictionary entry a backward.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

import torch

#: A marked step counts as kept once the loop is this many steps past it: the loop's
#: ``loss`` variable holds the last step's graph until the next loss replaces it.
KEPT_AFTER_STEPS = 2
_MARKS = 16  # sampled steps remembered (the oldest still alive is the origin)
_KEY = "traintop_step"


class _Marker:
    """Lives as long as the autograd node it is put on."""

    __slots__ = ("__weakref__", "step")

    def __init__(self, step: int) -> None:
        self.step = step


class RetainedGraphs:
    """Marks the losses of sampled steps; counts those still alive (see the module)."""

    def __init__(self) -> None:
        self.armed_at: int | None = None  # the sampled step whose backward to mark
        self._marks: deque[tuple[int, weakref.ref[_Marker]]] = deque(maxlen=_MARKS)

    def arm(self, step: int) -> None:
        """Mark the losses of ``step``'s backwards."""
        self.armed_at = step

    def mark(self, tensors: Any) -> None:
        """A backward runs from ``tensors`` (``torch.autograd.backward``'s first argument)."""
        step = self.armed_at
        if step is None:
            return
        for tensor in tensors if isinstance(tensors, (tuple, list)) else (tensors,):
            node = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None
            metadata = getattr(node, "metadata", None)
            if isinstance(metadata, dict) and _KEY not in metadata:
                marker = _Marker(step)
                metadata[_KEY] = marker
                self._marks.append((step, weakref.ref(marker)))
                self.armed_at = None  # one loss a step is enough to tell
                return

    def read(self, step: int, into: dict[str, Any]) -> None:
        """How many marked losses are kept at ``step``, and the oldest, ``into`` the record."""
        marks = self._marks
        while marks and marks[0][1]() is None:
            marks.popleft()
        kept = [at for at, ref in marks if at <= step - KEPT_AFTER_STEPS and ref() is not None]
        if kept:
            into["retained_graphs"] = len(kept)
            into["retained_origin"] = f"the loss of step {kept[0]}"
