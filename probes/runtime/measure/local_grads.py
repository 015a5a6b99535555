"""This rank's own gradients, before the all-reduce makes every rank's the same.

Under DDP the gradients a record carries are averaged across ranks: a rank whose batch
is bad (a corrupt shard, labels of another task) makes everyone's gradients large, and
nothing in them says which rank did it. A tensor hook on a parameter sees the gradient
a backward pass brings *before* it is accumulated into ``.grad``, where DDP's reducer
(a hook on the accumulation) all-reduces it. On a data-parallel job's sampled steps
only, each parameter's incoming gradient norm is taken there (one norm a parameter and
a pass, on the device, nothing read); the step's ``local_grad_norm`` is their total,
the passes of an accumulation in quadrature. The job's cross-rank check compares it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter

import torch
from torch.utils.hooks import RemovableHandle


class LocalGradients:
    """Incoming gradient norms of every trainable parameter, while attached.

    Args:
        params: the watched model's trainable parameters.
        on_error: called with an exception raised inside a hook of ours (never raised
            into the backward pass).
    """

    def __init__(
        self, params: Sequence[torch.nn.Parameter], on_error: Callable[[Exception], None]
    ) -> None:
        self._params = [p for p in params if p.requires_grad]
        self._on_error = on_error
        self._handles: list[RemovableHandle] = []
        self._norms: list[torch.Tensor] = []
        self.spent = 0.0  # seconds in its hooks (inside backward): drained by the measurer

    def attach(self) -> None:
        """A sampled step begins: a hook on each parameter until ``take``."""
        if self._handles:
            return
        self._norms = []
        self._handles = [p.register_hook(self._note) for p in self._params]

    def take(self) -> torch.Tensor | None:
        """The gradients are final: remove the hooks; the total norm they saw (a 0-d
        float32 tensor, not read), or None when no pass brought one."""
        self.detach()
        norms, self._norms = self._norms, []
        if not norms:
            return None
        device = norms[0].device  # (a model split over devices: one total)
        return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))

    def detach(self) -> None:
        """Remove every hook (a step that ended, or failed)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _note(self, grad: torch.Tensor) -> None:
        started = perf_counter()
        try:
            # (a sparse embedding's rows are not this check's)
            if not grad.is_sparse and torch.is_floating_point(grad):
                norm = torch.linalg.vector_norm(grad.detach(), dtype=torch.float32)
                self._norms.append(norm)
        except Exception as exc:  # a hook of ours must never raise into backward
            self._on_error(exc)
        self.spent += perf_counter() - started  # (the probe's own time: the measurer's)
