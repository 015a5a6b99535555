"""AMP seen by the probe: gradients a GradScaler still holds multiplied by its scale.

With ``torch.amp.GradScaler``, ``scaler.scale(loss).backward()`` leaves every gradient
multiplied by the loss scale (65,536 at the start) until ``scaler.unscale_(optimizer)``
(or ``scaler.step``, which unscales first). Clipping before ``unscale_`` compares
``max_norm`` with scaled norms: the clip cuts every step, and the norms the probe reads
there look like an explosion 65,536 times the healthy one. So while a probe is open,
``GradScaler.scale`` and ``GradScaler.update`` note which scalers have scaled a loss
since their last update; where the probe reads gradients (a clip, the optimizer's
pre-step hook) it asks whether one of them has not yet unscaled the optimizer
(GradScaler's own per-optimizer stage), and the step record says so
(``grads_scaled``): the monitor raises ``grads_still_scaled``, not ``exploding_gradient``.

Training is unchanged: torch's own methods run with the same arguments.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState

#: Scalers that scaled a loss since their last ``update`` (the step under way's).
_scaled: weakref.WeakKeyDictionary[GradScaler, bool] = weakref.WeakKeyDictionary()

#: torch's own methods, captured before anything could replace them.
torch_scale = GradScaler.scale
torch_update = GradScaler.update

_lock = threading.Lock()
_installed = 0

#: Whether any GradScaler scaled a loss while a probe was open (reset by the last
#: ``uninstall``): until one does, ``still_scaled`` (and the probe's step, which reads
#: this first) costs one global read a step (the table's ``len`` is a Python call).
any_scaled = False

#: The last loss a GradScaler scaled, and what it returned (``unscaled``).
_last_scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None


@functools.wraps(torch_scale)
def _scale(self: GradScaler, outputs: Any) -> Any:
    global _last_scaled, any_scaled
    any_scaled = True
    _scaled[self] = True
    result = torch_scale(self, outputs)
    if isinstance(result, torch.Tensor) and isinstance(outputs, torch.Tensor):
        _last_scaled = (weakref.ref(result), outputs)
    return result


def unscaled(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` as it was before a GradScaler scaled it (``scaler.scale(loss).backward()``:
    the step's loss is the one computed, not its scaled copy); else ``loss`` itself."""
    last = _last_scaled
    if last is not None and last[0]() is loss:
        return last[1]
    return loss


@functools.wraps(torch_update)
def _update(self: GradScaler, new_scale: Any = None) -> None:
    _scaled.pop(self, None)
    return torch_update(self, new_scale)


def still_scaled(optimizer: torch.optim.Optimizer | None) -> float | None:
    """The loss scale still in ``optimizer``'s gradients: a GradScaler, enabled, scaled
    a loss since its last update and has not unscaled this optimizer (None: none has,
    the common case, which costs one look at an empty table). Reads the scale (a host
    sync on an accelerator) only then: in the case that is a bug."""
    if not any_scaled or not _scaled:
        return None
    for scaler in list(_scaled.keys()):
        if not scaler.is_enabled():
            continue
        states = scaler._per_optimizer_states  # (a defaultdict: .get adds nothing)
        state = states.get(id(optimizer)) if optimizer is not None else None
        if state is not None and state.get("stage") is not OptState.READY:
            continue  # unscaled (or stepped) already
        scale = float(scaler.get_scale())
        if scale != 1.0:
            return scale
    return None


def install() -> None:
    """Note GradScalers' scale and update calls (counted: one per open probe)."""
    global _installed
    with _lock:
        _installed += 1
        if _installed == 1:
            GradScaler.scale = _scale  # type: ignore[method-assign]
            GradScaler.update = _update  # type: ignore[method-assign]


def uninstall() -> None:
    """Undo one ``install``; the last one puts torch's methods back, unless someone
    replaced ours since (theirs is left alone)."""
    global _installed, _last_scaled, any_scaled
    with _lock:
        if _installed == 0:
            return
        _installed -= 1
        if _installed:
            return
        if GradScaler.scale is _scale:
            GradScaler.scale = torch_scale  # type: ignore[method-assign]
        if GradScaler.update is _update:
            GradScaler.update = torch_update  # type: ignore[method-assign]
        _scaled.clear()
        _last_scaled = None
        any_scaled = False
