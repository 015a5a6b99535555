"""One evaluation as the probe sees it: its scalars, and how its forward passes ran.

The eval-mode checks count forwards run in training mode and with gradient recording
on (the two controls are orthogonal: ``model.eval()`` and ``torch.inference_mode()``).
They hook the model itself and every layer, so a validation step that calls a
submodule (``model.encoder(x)``) is checked too; a module counts once per call and
the record takes, for each count, the largest over the hooked modules: the number of
forward passes that ran so, whichever entry point they used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.kernel.schema import EvalRecord
from probes.runtime.hooks import eager


class EvalScope:
    """The scalars of one evaluation and its forward counts; ``record`` makes the record.

    Args:
        modules: the modules to watch (the model and its layers).
        step: the step it is tagged with: the number of steps completed before it
            (the index of the next step), or the open step's index when it runs inside
            one (``Probe.evaluate``).
    """

    def __init__(self, modules: list[nn.Module], step: int) -> None:
        self.step = step
        self.time = time.time()
        self.tensors: dict[str, torch.Tensor] = {}
        self.floats: dict[str, float] = {}
        # per hooked module: [calls, calls in training mode, calls with grad recording]
        self._counts: list[list[int]] = [[0, 0, 0] for _ in modules]
        self._handles: list[RemovableHandle] = [
            module.register_forward_pre_hook(eager(self._counter(i)))
            for i, module in enumerate(modules)
        ]

    def _counter(self, index: int) -> Callable[[nn.Module, Any], None]:
        counts = self._counts[index]

        def count(module: nn.Module, args: Any) -> None:
            # Plain attribute reads and sums: nothing here can raise into a forward.
            counts[0] += 1
            counts[1] += int(module.training)
            counts[2] += int(torch.is_grad_enabled())

        return count

    def remove_hooks(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def record(self) -> EvalRecord:
        """The eval record: scalars (tensors read now: evaluation is over) and counts."""
        self.remove_hooks()
        scalars = {**{k: float(t) for k, t in self.tensors.items()}, **self.floats}
        return {
            "kind": "eval",
            "step": self.step,
            "time": self.time,
            "scalars": scalars,
            "forwards": max((c[0] for c in self._counts), default=0),
            "train_mode_forwards": max((c[1] for c in self._counts), default=0),
            "grad_forwards": max((c[2] for c in self._counts), default=0),
        }
