"""Structural checks: is the optimizer wired to the model it trains?

When ``watch()`` is called (no cost per step) the probe compares the model's parameters
with the optimizer's param groups and sends what it finds as alerts, at step 0:

- ``params_not_in_optimizer``: trainable parameters in no param group (a layer built or
  replaced after the optimizer, a list of modules that forgot one), naming the layers;
- ``optimizer_not_for_model``: the optimizer's parameters are not the model's (a copy
  of the model made after the optimizer was built): its updates never reach the model;
- ``mostly_frozen``: most of the model has ``requires_grad=False``, and which layers do
  train (a warning when only normalisation layers or biases are left).

Per step, ``UpdateCheck`` reads the parameters' version counters before and after
``optimizer.step()`` (no device work, no sync): a layer whose tensors the step did not
touch is reported in the record's ``not_stepped``, and the monitor's
``updates_not_applied`` rule weighs it against the layer's gradient (the hooks that
run it are ``probes.runtime.optimizers.optimizer_hooks``').
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from probes.kernel.diagnosis import Alert, Severity
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.runtime.measure.layers import LayerMap

MOSTLY_FROZEN = 0.9  # this fraction of the parameter elements frozen: mostly frozen
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
# A hand-written norm's class name: LayerNorm, RMSNorm, LlamaRMSNorm, T5LayerNorm ...
NORM_NAME = re.compile(r"norm(\d*d)?$", re.IGNORECASE)
NAMES_SHOWN = 6
_VERSION = operator.attrgetter("_version")


def watch_time_alerts(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, layers: LayerMap, step: int = 0
) -> list[Alert]:
    """What is wrong with how the model and its optimizer fit together, as alerts (at
    ``step``: 0 when ``watch()`` is called; later when the trainable set changes,
    ``probes.runtime.live_checks.wiring``)."""
    alerts = _frozen(model, layers, step)
    if optimizer is not None:
        alerts += _optimizer(model, optimizer, layers, step)
    return alerts


def _alert(
    kind: str,
    severity: Severity,
    subject: str,
    evidence: dict[str, Any],
    layers: Sequence[str],
    step: int,
) -> Alert:
    described = entry(kind)
    return Alert(
        kind,
        severity,
        step,
        subject,
        evidence,
        described.said,
        described.experiments,
        layers=tuple(layers),
    )


def _optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, layers: LayerMap, step: int
) -> list[Alert]:
    held = [p for group in optimizer.param_groups for p in group["params"]]
    held_ids = {id(p) for p in held}
    model_ids = {id(p) for p in model.parameters()}
    missing = [i for i, p in enumerate(layers.params) if id(p) not in held_ids]
    foreign = [p for p in held if id(p) not in model_ids]
    missing_layers = list(dict.fromkeys(layers.names[layers.param_layer[i]] for i in missing))
    if (
        foreign
        and missing
        and (
            len(missing) == len(layers.params)
            or _shapes_cover([layers.params[i] for i in missing], foreign)
        )
    ):
        return [
            _alert(
                AlertKind.OPTIMIZER_NOT_FOR_MODEL,
                Severity.ERROR,
                "",
                {
                    "foreign_params": len(foreign),
                    "model_params_held": len(layers.params) - len(missing),
                    "model_params": len(layers.params),
                    "same_shapes": _shapes_cover([layers.params[i] for i in missing], foreign),
                },
                missing_layers,
                step,
            )
        ]
    if not missing:
        return []
    names = [layers.param_names[i] for i in missing]
    evidence: dict[str, Any] = {"params": len(names), "names": ", ".join(names[:NAMES_SHOWN])}
    if len(missing_layers) > 1:
        evidence.update(
            layers_affected=len(missing_layers), range=f"{missing_layers[0]}..{missing_layers[-1]}"
        )
    return [
        _alert(
            AlertKind.PARAMS_NOT_IN_OPTIMIZER,
            Severity.WARNING,
            missing_layers[0],
            evidence,
            missing_layers,
            step,
        )
    ]


def _shapes_cover(missing: Sequence[torch.Tensor], foreign: Sequence[torch.Tensor]) -> bool:
    """Every missing parameter has a foreign one of its shape: a copy of the model."""
    available = Counter(tuple(p.shape) for p in foreign)
    needed = Counter(tuple(p.shape) for p in missing)
    return all(available[shape] >= count for shape, count in needed.items())


def _frozen(model: nn.Module, layers: LayerMap, step: int) -> list[Alert]:
    unique = {id(p): p for p in model.parameters()}
    total = sum(_numel(p) for p in unique.values())
    frozen = sum(_numel(p) for p in unique.values() if not p.requires_grad)
    if not total or frozen / total < MOSTLY_FROZEN:
        return []
    modules = dict(model.named_modules())
    training = list(layers.names)
    only_norms = all(is_norm(modules.get(name)) for name in training) or all(
        name.rpartition(".")[2] == "bias" for name in layers.param_names
    )
    return [
        _alert(
            AlertKind.MOSTLY_FROZEN,
            Severity.WARNING if only_norms else Severity.INFO,
            "",
            {
                "frozen_fraction": frozen / total,
                "trainable_params": total - frozen,
                "training": ", ".join(training[:NAMES_SHOWN]) or "none",
                "training_layers": len(training),
                "only_normalisation": only_norms,
            },
            training,
            step,
        )
    ]


def is_norm(module: nn.Module | None) -> bool:
    """Whether ``module`` is a normalisation layer, by what it is: one of torch's; a
    class named like one (``...Norm``); or a leaf whose only parameters are a 1-D gain
    (``weight``, ``scale``, ``gamma``) and maybe a bias of its size, applied elementwise
    at the normalised size (a hand-written LayerNorm or RMSNorm by any name)."""
    if module is None:
        return False
    if isinstance(module, NORM_TYPES) or NORM_NAME.search(type(module).__name__):
        return True
    if type(module).__module__.startswith("torch.") or next(module.children(), None) is not None:
        return False  # torch's others (a PReLU's 1-D weight is no gain); a block
    own = dict(module.named_parameters(recurse=False))
    gain = next((own.pop(n) for n in ("weight", "scale", "gamma") if n in own), None)
    shift = next((own.pop(n) for n in ("bias", "beta", "shift") if n in own), None)
    return (
        not own
        and gain is not None
        and gain.dim() == 1
        and (shift is None or shift.shape == gain.shape)
    )


def _numel(param: torch.Tensor) -> int:
    return 0 if isinstance(param, nn.parameter.UninitializedParameter) else param.numel()


def counters_blind(optimizer: torch.optim.Optimizer) -> bool:
    """True when every param group steps fused (``fused=True``): torch's fused kernels
    write the parameters without bumping their version counters."""
    groups = optimizer.param_groups
    return bool(groups) and all(group.get("fused") is True for group in groups)


class UpdateCheck:
    """Which layers did ``optimizer.step()`` leave untouched? Read from the version
    counters of their parameters (every in-place update bumps them): two C-level passes
    over plain attributes a step, nothing on the device. A custom optimizer that writes
    through ``.data`` bumps no counter, and neither do torch's fused ones
    (``fused=True``, the HF Trainer's default AdamW): the monitor then sees weights
    change on sampled steps although the counters did not, and stops trusting them.

    An optimizer known to step fused (``blind``: every param group ``fused=True``) is
    not checked at all: its counters say nothing, and a record listing every layer as
    untouched would only be noise. A step that leaves some tensors alone (parameters
    without a gradient: the same ones step after step) costs one more C-level pass:
    the layers are worked out again only when the set of untouched tensors changes."""

    def __init__(self, layers: LayerMap, *, blind: bool = False) -> None:
        self.blind = blind
        self.params = layers.params
        self.param_layer = layers.param_layer
        self.layer_count = layers.num_layers
        self._before: list[int] | None = None
        # the last answer that was not "every layer touched", and which tensors it
        # was of (True: unchanged)
        self._unchanged: tuple[bool, ...] | None = None
        self._untouched: list[int] = []

    def before(self) -> None:
        if not self.blind:
            self._before = list(map(_VERSION, self.params))  # (in C: no Python loop a step)

    def after(self) -> list[int] | None:
        """The layers none of whose parameters changed version (None: not checked)."""
        before, self._before = self._before, None
        if before is None:
            return None
        now = list(map(_VERSION, self.params))
        if all(map(operator.ne, now, before)):  # the common step: every tensor updated
            return []
        unchanged = tuple(map(operator.eq, now, before))  # (in C)
        if unchanged != self._unchanged:
            self._unchanged = unchanged
            self._untouched = self._layers_untouched(unchanged)
        return list(self._untouched)  # (a copy: the record keeps it)

    def _layers_untouched(self, unchanged: tuple[bool, ...]) -> list[int]:
        layer = self.param_layer
        changed = {layer[i] for i, same in enumerate(unchanged) if not same}
        if len(changed) == self.layer_count:
            return []
        return [i for i in range(self.layer_count) if i not in changed]
