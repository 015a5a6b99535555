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

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState

from probes.runtime.patches.patches import Held, Layer
from probes.runtime.patches.seams import SCALER_SCALE, SCALER_UPDATE

#: Scalers that scaled a loss since their last ``update`` (the step under way's).
_scaled: weakref.WeakKeyDictionary[GradScaler, bool] = weakref.WeakKeyDictionary()

_lock = threading.Lock()
_installed = 0
_held = Held()

#: Whether any GradScaler scaled a loss while a probe was open (reset by the last
#: ``uninstall``): until one does, ``still_scaled`` (and the probe's step, which reads
#: this first) costs one global read a step (the table's ``len`` is a Python call).
any_scaled = False

#: The last loss a GradScaler scaled, and what it returned (``unscaled``).
_last_scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None


def _scale(proceed: Callable[..., Any], self: GradScaler, outputs: Any) -> Any:
    global _last_scaled, any_scaled
    any_scaled = True
    _scaled[self] = True
    result = proceed(self, outputs)
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


def _update(proceed: Callable[..., Any], self: GradScaler, new_scale: Any = None) -> None:
    _scaled.pop(self, None)
    return proceed(self, new_scale)


def still_scaled(optimizer: torch.optim.Optimizer | None) -> float | None:
    """The loss scale still in ``optimizer``'s gradients: a GradScaler, enabled, scaled
    a loss since its last update and has not unscaled this optimizer (None: none has,
    the common case, which costs one look at an empty table). Several optimizers
    watched as one (a GAN's, under one scaler; ``OptimizerSet``) are unscaled once the
    scaler has unscaled or stepped any of them since its update: their gradients are
    read at each one's own ``scaler.step``. Reads the scale (a host sync on an
    accelerator) only then: in the case that is a bug."""
    if not any_scaled or not _scaled:
        return None
    optimizers = getattr(optimizer, "optimizers", None) or (optimizer,)
    for scaler in list(_scaled.keys()):
        if not scaler.is_enabled():
            continue
        states = scaler._per_optimizer_states  # (a defaultdict: .get adds nothing)
        if any(_unscaled(states.get(id(each))) for each in optimizers if each is not None):
            continue  # unscaled (or stepped) already
        scale = float(scaler.get_scale())
        if scale != 1.0:
            return scale
    return None


def _unscaled(state: dict[str, Any] | None) -> bool:
    return state is not None and state.get("stage") is not OptState.READY


def install() -> None:
    """Note GradScalers' scale and update calls (counted: one per open probe)."""
    global _installed
    with _lock:
        _installed += 1
        if _installed == 1:
            _held.hold(SCALER_SCALE, Layer("amp", _scale))
            _held.hold(SCALER_UPDATE, Layer("amp", _update))


def uninstall() -> None:
    """Undo one ``install``; the last one puts torch's methods back."""
    global _installed, _last_scaled, any_scaled
    with _lock:
        if _installed == 0:
            return
        _installed -= 1
        if _installed:
            return
        _held.release()
        _scaled.clear()
        _last_scaled = None
        any_scaled = False
