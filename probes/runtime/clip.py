"""Clipping seen by the probe: the unclipped norms are recorded, results unchanged.

Clipping can keep one run finite, but it hides the instability it cuts off: the lesson
says to log the unclipped norm. The Hugging Face Trainer (through accelerate) and
Lightning clip inside their own step, by calling ``torch.nn.utils.clip_grad_norm_``
just before ``optimizer.step()``, where the probe would otherwise read already
clipped gradients. So while a probe is open, ``torch.nn.utils.clip_grad_norm_`` is
replaced by ``clip_grad_norm_`` below, which lets each probe watching the parameters
read the gradients first, calls torch's own function with the same arguments (so
training is bit for bit the same), and records the clip: max norm, and torch's total
norm before and after. The original is put back when the last probe closes.

Code that imported the function before the probe was made (``from torch.nn.utils import
clip_grad_norm_`` at module scope) keeps torch's original: call ``probes.clip_grad_norm_``
there instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad

from probes.runtime import amp
from probes.runtime.lifecycle import OpenProbe, probes_watching

#: torch's own function, captured before anything could replace it.
torch_clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_

_lock = threading.Lock()
_installed = 0


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
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    watching = _probes_watching_any(params)
    for probe in watching:
        probe.clipping(float(max_norm), float(norm_type))
    total = torch_clip_grad_norm_(
        params,
        max_norm,
        norm_type=norm_type,
        error_if_nonfinite=error_if_nonfinite,
        foreach=foreach,
    )
    for probe in watching:
        probe.clipped(total)
    return total


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
    """Route ``torch.nn.utils.clip_grad_norm_`` through ``clip_grad_norm_`` (counted:
    one ``install`` per open probe), and note GradScalers' scaling (``amp``): a clip
    of gradients still scaled is what the probe must say first."""
    global _installed
    amp.install()
    with _lock:
        _installed += 1
        if _installed == 1:
            torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
            torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_


def uninstall() -> None:
    """Undo one ``install``; the last one puts torch's function back, unless someone
    replaced ours since (theirs is left alone)."""
    global _installed
    amp.uninstall()
    with _lock:
        if _installed == 0:
            return
        _installed -= 1
        if _installed:
            return
        if torch.nn.utils.clip_grad_norm_ is clip_grad_norm_:
            torch.nn.utils.clip_grad_norm_ = torch_clip_grad_norm_
        if torch.nn.utils.clip_grad.clip_grad_norm_ is clip_grad_norm_:
            torch.nn.utils.clip_grad.clip_grad_norm_ = torch_clip_grad_norm_
