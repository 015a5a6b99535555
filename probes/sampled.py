"""Costlier statistics, taken on sampled steps only (every ``sample_every`` steps).

``ActivationStats`` attaches forward hooks to the activation modules for one step and
counts dead (exactly zero, ReLU family) or saturated (tanh, sigmoid) outputs on the
device. ``UpdateNorms`` copies the weights before ``optimizer.step()`` and takes the
norm of the change after it. Neither reads a value: the results join the step's
batched copy to the host, and every hook handle is removed when the step ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.stats import NormReducer

# Module type -> (family, test of an output element being dead or saturated).
RELU_TYPES: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)
TANH_TYPES: tuple[type[nn.Module], ...] = (nn.Tanh, nn.Hardtanh)
SIGMOID_TYPES: tuple[type[nn.Module], ...] = (nn.Sigmoid, nn.Hardsigmoid)
TANH_SATURATED = 0.99  # |tanh(x)| above this: the gradient 1 - y^2 is below 0.02
SIGMOID_SATURATED = 0.01  # sigmoid below this or above 1 - this
MODE_SENSITIVE_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm,
)


def activation_family(module: nn.Module) -> str | None:
    """``"relu"``, ``"tanh"``, ``"sigmoid"`` or None for other modules."""
    if isinstance(module, RELU_TYPES):
        return "relu"
    if isinstance(module, TANH_TYPES):
        return "tanh"
    if isinstance(module, SIGMOID_TYPES):
        return "sigmoid"
    return None


def count_mode_sensitive(model: nn.Module) -> int:
    """Modules that behave differently in train and eval mode (dropout, batch norm)."""
    return sum(isinstance(m, MODE_SENSITIVE_TYPES) for m in model.modules())


@dataclass
class _Tally:
    hits: torch.Tensor | None = None
    total: int = 0


class ActivationStats:
    """Fraction of dead or saturated outputs per activation module, on sampled steps.

    Only ``nn.Module`` activations can be seen (``F.relu`` inside a forward cannot).
    """

    def __init__(self, model: nn.Module, layer_names: tuple[str, ...] = ()) -> None:
        # (name, family, module, index of the layer feeding it: the last layer before
        # it in module order, so the monitor can colour that layer's row)
        self.modules: list[tuple[str, str, nn.Module, int | None]] = []
        layer_index = {name: i for i, name in enumerate(layer_names)}
        feeding: int | None = None
        for name, module in model.named_modules():
            key = name or "(root)"
            feeding = layer_index.get(key, feeding)
            family = activation_family(module)
            if family is not None:
                self.modules.append((key, family, module, feeding))
        self._handles: list[RemovableHandle] = []
        self._tallies: list[_Tally] = []

    @property
    def names(self) -> list[list[object]]:
        """``[name, family, feeding layer index]`` per activation module (for the hello)."""
        return [[name, family, layer] for name, family, _, layer in self.modules]

    def attach(self) -> None:
        """Start counting (one step)."""
        self.detach()
        self._tallies = [_Tally() for _ in self.modules]
        for index, (_, family, module, _) in enumerate(self.modules):
            self._handles.append(module.register_forward_hook(self._hook(index, family)))

    def detach(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def take(self) -> tuple[list[torch.Tensor], list[int]]:
        """Detach; return the hit counts (0-d tensors) and element totals of the modules
        that ran. Modules that did not run this step are left out (total 0)."""
        self.detach()
        tallies, self._tallies = self._tallies, []
        counts = [t.hits for t in tallies if t.hits is not None]
        totals = [t.total for t in tallies]
        return counts, totals

    def _hook(self, index: int, family: str):
        def count(module: nn.Module, args: object, output: object) -> None:
            if not isinstance(output, torch.Tensor) or index >= len(self._tallies):
                return
            with torch.no_grad():
                if family == "relu":
                    hits = (output == 0).sum(dtype=torch.float32)
                elif family == "tanh":
                    hits = (output.abs() > TANH_SATURATED).sum(dtype=torch.float32)
                else:
                    saturated = (output < SIGMOID_SATURATED) | (output > 1 - SIGMOID_SATURATED)
                    hits = saturated.sum(dtype=torch.float32)
            tally = self._tallies[index]
            tally.hits = hits if tally.hits is None else tally.hits + hits
            tally.total += output.numel()
        return count


class UpdateNorms:
    """|w_after - w_before| per parameter across one ``optimizer.step()``."""

    def __init__(self, params: tuple[nn.Parameter, ...], norms: NormReducer) -> None:
        self.params = list(params)
        self._norms = norms
        self._before: list[torch.Tensor] | None = None

    def before_step(self) -> None:
        """Copy the weights (one batched op)."""
        with torch.no_grad():
            self._before = torch._foreach_mul(self.params, 1.0)

    def after_step(self) -> tuple[list[torch.Tensor] | None, tuple[int, ...] | None]:
        """Norms of the change (0-d tensors) and their order, or None without a copy."""
        before, self._before = self._before, None
        if before is None:
            return None, None
        with torch.no_grad():
            return self._norms.norms(torch._foreach_sub(self.params, before))

    def discard(self) -> None:
        """Drop the copy (a step that failed)."""
        self._before = None
