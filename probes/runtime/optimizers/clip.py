"""Clipping seen by the probe: the unclipped norms are recorded, results unchanged.

Clipping can keep one run finite, but it hides the instability it cuts off: the lesson
says to log the unclipped norm. The Hugging Face Trainer (through accelerate) and
Lightning clip inside their own step, just before ``optimizer.step()``, where the probe
would otherwise read already clipped gradients. Every clip by norm in torch (2.6 on)
ends in one function, ``clip_grads_with_norm_``: ``clip_grad_norm_`` calls it (looked up
in its module when it runs, so a ``clip_grad_norm_`` imported by name before any probe
existed goes through it too), and accelerate calls it after ``get_total_norm``. So
while a probe is open, that function (by its public name and its module's) and
``clip_grad_norm_`` (for the norm's type) have stand-ins (``probes.runtime.patches.patches``):
each probe watching the parameters reads the gradients first, then torch's own
function runs with the same arguments (training is bit for bit the same), and the
clip is recorded: max norm, and torch's total norm before it. torch's functions are
back when the last probe closes. (On a torch without ``clip_grads_with_norm_``,
``clip_grad_norm_`` reads them itself, and a name imported early keeps torch's: call
``probes.clip_grad_norm_`` there.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad

from probes.runtime.lifecycle import OpenProbe, probes_watching
from probes.runtime.optimizers import amp
from probes.runtime.patches.patches import REGISTRY, Layer
from probes.runtime.patches.seams import CLIP_GRAD_NORM, CLIP_WITH_NORM

#: torch's own function, captured before anything could replace it.
torch_clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_

_clip = threading.local()  # the norm's type of a clip_grad_norm_ under way


def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Clip like ``torch.nn.utils.clip_grad_norm_``; the probe records the norms first.

    Arguments and return value are torch's: the total norm of the gradients before
    clipping. The step record then carries the unclipped per-layer norms and ``clip``
    (max norm, total before and after), so the exploding-gradient rule sees what
    clipping hid.

    Example::

        loss.backward()
        probes.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    """
    return _clip_grad_norm(
        torch_clip_grad_norm_, parameters, max_norm, norm_type, error_if_nonfinite, foreach
    )


def _clip_grad_norm(
    proceed: Callable[..., torch.Tensor],
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """``clip_grad_norm_``'s layer: where ``clip_grads_with_norm_`` has a stand-in, the
    reading happens there (this notes the norm's type); else here."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    arguments = {"norm_type": norm_type, "error_if_nonfinite": error_if_nonfinite}
    if foreach is not None:
        arguments["foreach"] = foreach
    if any(seam.installed for seam in CLIP_WITH_NORM):
        previous = getattr(_clip, "norm_type", None)
        _clip.norm_type = float(norm_type)
        try:
            return proceed(params, max_norm, **arguments)
        finally:
            _clip.norm_type = previous
    watching = _probes_watching_any(params)
    for probe in watching:
        probe.clipping(float(max_norm), float(norm_type))
    total = proceed(params, max_norm, **arguments)
    for probe in watching:
        probe.clipped(total)
    return total


def _clip_with_norm(
    proceed: Callable[..., None],
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    total_norm: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> None:
    """``clip_grads_with_norm_``'s layer: the probes read the gradients before they are
    scaled, then torch's function scales them."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    watching = _probes_watching_any(params)
    norm_type = getattr(_clip, "norm_type", None)
    for probe in watching:
        probe.clipping(float(max_norm), 2.0 if norm_type is None else norm_type)
    proceed(params, max_norm, total_norm, *args, **kwargs)
    for probe in watching:
        probe.clipped(total_norm)


def _probes_watching_any(params: list[torch.Tensor]) -> list[OpenProbe]:
    """The probes that watch these parameters: those of the first parameter any probe
    owns (a model's first parameters may be frozen ones, which no probe watches)."""
    for param in params:
        if param.requires_grad:
            found = probes_watching(param)
            if found:
                return found
    return []


def install() -> None:
    """Give torch's clip stand-ins that read first (one ``install`` per open probe, or
    ``traintop run``'s one for the process: the registry counts them), and note
    GradScalers' scaling (``amp``): a clip of gradients still scaled is what the probe
    must say first."""
    amp.install()
    for seam in CLIP_GRAD_NORM:
        REGISTRY.add(seam, _CLIP_LAYER)
    for seam in CLIP_WITH_NORM:
        REGISTRY.add(seam, _WITH_NORM_LAYER)


def uninstall() -> None:
    """Undo one ``install``; the last one puts torch's functions back."""
    amp.uninstall()
    for seam in CLIP_GRAD_NORM:
        REGISTRY.remove(seam, _CLIP_LAYER)
    for seam in CLIP_WITH_NORM:
        REGISTRY.remove(seam, _WITH_NORM_LAYER)


_CLIP_LAYER = Layer("clip", _clip_grad_norm)
_WITH_NORM_LAYER = Layer("clip", _clip_with_norm)
