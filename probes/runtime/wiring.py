"""The watch-time checks again, whenever the set of trainable parameters changes.

A backbone frozen at the start and unfrozen later, with the optimizer built from
``filter(lambda p: p.requires_grad, ...)``, never trains: its parameters are in no
param group. ``probes.runtime.structure`` finds that when ``watch()`` is called; this
re-runs it when the model's ``requires_grad`` flags or the optimizer's param groups
change. The change is looked for on sampled steps only, by comparing one signature (the
flags, read in C, and the groups' sizes): no Python pass over the parameters per step.
An alert is sent once: what was said already (same kind, severity and layers) is not
said again.
"""

from __future__ import annotations

from operator import attrgetter

import torch
from torch import nn

from probes.kernel.diagnosis import Alert
from probes.runtime.layers import LayerMap, map_layers
from probes.runtime.structure import watch_time_alerts

_REQUIRES_GRAD = attrgetter("requires_grad")
_Signature = tuple[tuple[bool, ...], tuple[int, ...]]


class WiringWatch:
    """The model's trainable set and its optimizer's groups, as last checked.

    Args:
        module: the watched model (unwrapped).
        optimizer: its optimizer, if any.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._module = module
        self._optimizer = optimizer
        # every parameter once (tied ones too), in the order the model lists them
        self._params = tuple({id(p): p for p in module.parameters()}.values())
        self._signature = self._now()
        self._said: set[tuple[str, str, tuple[str, ...]]] = set()

    def first_alerts(self, layers: LayerMap) -> list[Alert]:
        """The checks when ``watch()`` is called (step 0)."""
        return self._new(watch_time_alerts(self._module, self._optimizer, layers))

    def check(self, step: int) -> list[Alert]:
        """A sampled step begins: the checks again if the trainable set or the param
        groups changed since the last look; the alerts not said before."""
        now = self._now()
        if now == self._signature:
            return []
        self._signature = now
        layers = map_layers(self._module)
        return self._new(watch_time_alerts(self._module, self._optimizer, layers, step))

    def _now(self) -> _Signature:
        flags = tuple(map(_REQUIRES_GRAD, self._params))
        groups = () if self._optimizer is None else self._optimizer.param_groups
        return flags, tuple(len(group["params"]) for group in groups)

    def _new(self, alerts: list[Alert]) -> list[Alert]:
        fresh = []
        for alert in alerts:
            said = (str(alert.kind), str(alert.severity), alert.layers)
            if said not in self._said:
                self._said.add(said)
                fresh.append(alert)
        return fresh
