"""The watch-time checks again, whenever the set of trainable parameters changes.

A backbone frozen at the start and unfrozen later, with the optimizer built from
``filter(lambda p: p.requires_grad, ...)``, never trains: its parameters are in no
param group. ``probes.runtime.live_checks.structure`` finds that when ``watch()`` is called; this
re-runs it when the model's ``requires_grad`` flags or the optimizer's param groups
change. The change is looked for on sampled steps only, by comparing one signature (the
flags, read in C, and the groups' sizes): no Python pass over the parameters per step.
An alert is sent once: what was said already (same kind, severity and layers) is not
said again.

A model mostly frozen is a note (``mostly_frozen``, info) only once it has stayed so for
``FROZEN_NOTE_AFTER`` steps: a backbone frozen for the first steps of a fine-tune and
then unfrozen is a recipe, not news. The warning (only normalisation layers or biases
train) is said at once.
"""

from __future__ import annotations

from dataclasses import replace
from operator import attrgetter

import torch
from torch import nn

from probes.kernel.diagnosis import Alert, Severity
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.runtime.live_checks.structure import watch_time_alerts
from probes.runtime.measure.layers import LayerMap, map_layers

_REQUIRES_GRAD = attrgetter("requires_grad")
_Signature = tuple[tuple[bool, ...], tuple[int, ...]]
FROZEN_NOTE_AFTER = 100  # steps a model stays mostly frozen before the note says so


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
        self._frozen_since: int | None = None  # a mostly_frozen note held back since

    def first_alerts(self, layers: LayerMap) -> list[Alert]:
        """The checks when ``watch()`` is called (step 0)."""
        alerts = watch_time_alerts(self._module, self._optimizer, layers)
        return self._new(self._hold_frozen_note(alerts, 0))

    def check(self, step: int) -> list[Alert]:
        """A sampled step begins: the checks again if the trainable set or the param
        groups changed since the last look, or a note held back is due; the alerts not
        said before."""
        now = self._now()
        due = self._frozen_since is not None and step - self._frozen_since >= FROZEN_NOTE_AFTER
        if now == self._signature and not due:
            return []
        self._signature = now
        layers = map_layers(self._module)
        alerts = watch_time_alerts(self._module, self._optimizer, layers, step)
        return self._new(self._hold_frozen_note(alerts, step))

    def _hold_frozen_note(self, alerts: list[Alert], step: int) -> list[Alert]:
        """The alerts to say now: a mostly_frozen note only once the model has stayed
        mostly frozen for ``FROZEN_NOTE_AFTER`` steps (the step it began in evidence)."""
        note = next(
            (
                a
                for a in alerts
                if a.kind == AlertKind.MOSTLY_FROZEN and a.severity == Severity.INFO
            ),
            None,
        )
        if note is None:
            self._frozen_since = None
            return alerts
        since = step if self._frozen_since is None else self._frozen_since
        if step - since < FROZEN_NOTE_AFTER:
            self._frozen_since = since
            return [a for a in alerts if a is not note]
        self._frozen_since = None
        held = replace(note, evidence={**note.evidence, "frozen_since_step": since})
        return [held if a is note else a for a in alerts]

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
