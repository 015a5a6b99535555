"""One evaluation as the probe sees it: its scalars, and how its forward passes ran.

The eval-mode checks count forwards run in training mode and with gradient recording
on (the two controls are orthogonal: ``model.eval()`` and ``torch.inference_mode()``).
They hook the model itself and every layer, so a validation step that calls a
submodule (``model.encoder(x)``) is checked too; a module counts once per call and
the record takes, for each count, the largest over the hooked modules: the number of
forward passes that ran so, whichever entry point they used.

Training mode only matters where a module behaves differently in it
(``is_mode_sensitive``: dropout, batch norm and instance norm with running
statistics, recurrent and attention layers with dropout): those are hooked too, and
``sensitive_train_forwards`` counts their forwards in training mode. Dropout called as
a function (``F.dropout(x, p)``) is counted by the dropout functions' stand-ins while
the evaluation is open (``probes.runtime.evaluation.functional``:
``dropout_train_calls``).

A module inside a compiled region is never hooked (``probes.runtime.patches.hooks``): the model's
counts are taken where the compiled model is entered, which also counts, once per call,
its mode-sensitive modules left in training mode inside; a layer of a compiled model
called on its own is not seen, nor is dropout called as a function by a model with a
compiled part (the wrapper would recompile it: dynamo guards on ``F.dropout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from probes.kernel.schema import EvalRecord
from probes.runtime.evaluation.functional import DROPOUT_CALLS
from probes.runtime.patches.hooks import EntryHandle, compiled_modules, eager, entry_pre_hook
from probes.runtime.patches.module_hooks import ModuleHookHandle, add_hook

#: Modules that behave differently in training mode whatever their settings.
ALWAYS_SENSITIVE: tuple[type[nn.Module], ...] = (nn.modules.dropout._DropoutNd,)
#: Modules that do when they carry dropout (``dropout`` > 0, as an attribute).
DROPOUT_CARRIERS: tuple[type[nn.Module], ...] = (
    nn.RNNBase,
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
)


def is_mode_sensitive(module: nn.Module) -> bool:
    """Would ``module.eval()`` change what ``module`` computes? Dropout; batch norm and
    instance norm that keep running statistics; recurrent, attention and transformer
    layers with a dropout above 0 (``nn.LSTM(dropout=0.2)``)."""
    if isinstance(module, ALWAYS_SENSITIVE):
        return True
    if isinstance(module, nn.modules.batchnorm._NormBase):  # batch and instance norm
        return bool(module.track_running_stats)
    if isinstance(module, DROPOUT_CARRIERS):
        rate = getattr(module, "dropout", 0.0)
        if isinstance(rate, nn.Module):  # transformer layers keep nn.Dropout modules
            rate = getattr(rate, "p", 0.0)
        return isinstance(rate, int | float) and rate > 0
    return False


def count_mode_sensitive(model: nn.Module) -> int:
    """Modules of ``model`` that behave differently in train and eval mode."""
    return sum(map(is_mode_sensitive, model.modules()))


class EvalScope:
    """The scalars of one evaluation and its forward counts; ``record`` makes the record.

    Args:
        modules: the modules to watch (the model and its layers); the first is the
            model, whose mode-sensitive modules are watched too.
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
        compiled = compiled_modules(modules[0]) if modules else set()
        self._handles: list[ModuleHookHandle | EntryHandle] = [
            entry_pre_hook(module, eager(self._counter(i)))
            if i == 0
            else add_hook(module, module.register_forward_pre_hook, eager(self._counter(i)))
            for i, module in enumerate(modules)
            if i == 0 or id(module) not in compiled
        ]
        self.sensitive_train_forwards = 0
        self.dropout_train_calls = 0
        sensitive = [m for m in modules[0].modules() if is_mode_sensitive(m)] if modules else []
        self._handles += [
            add_hook(module, module.register_forward_pre_hook, eager(self._count_sensitive))
            for module in sensitive
            if id(module) not in compiled
        ]
        # Those inside compiled code: looked at where the model is entered.
        self._compiled_sensitive = [m for m in sensitive if id(m) in compiled]
        if self._compiled_sensitive:
            self._handles.append(entry_pre_hook(modules[0], self._count_compiled_sensitive))
        if not compiled:  # dynamo guards on ``F.dropout``: a wrapper there recompiles
            DROPOUT_CALLS.open(self)

    def _counter(self, index: int) -> Callable[[nn.Module, Any], None]:
        counts = self._counts[index]

        def count(module: nn.Module, args: Any) -> None:
            # Plain attribute reads and sums: nothing here can raise into a forward.
            counts[0] += 1
            counts[1] += int(module.training)
            counts[2] += int(torch.is_grad_enabled())

        return count

    def _count_sensitive(self, module: nn.Module, args: Any) -> None:
        self.sensitive_train_forwards += int(module.training)

    def _count_compiled_sensitive(self, module: nn.Module, args: Any) -> None:
        self.sensitive_train_forwards += sum(m.training for m in self._compiled_sensitive)

    def remove_hooks(self) -> None:
        """Remove every hook and the dropout functions' wrappers (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        DROPOUT_CALLS.close(self)

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
            "sensitive_train_forwards": self.sensitive_train_forwards,
            "dropout_train_calls": self.dropout_train_calls,
        }
