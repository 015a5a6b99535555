"""``probes.clip_grad_norm_``: torch's clipping, with the unclipped norms recorded.

Clipping can keep one run finite, but it hides the instability it cuts off: the lesson
says to log the unclipped norm. This drop-in tells the probe watching these parameters
to read the gradients first, then calls ``torch.nn.utils.clip_grad_norm_`` itself, so
the results are torch's own, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from probes.probe import probes_watching


def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Clip like ``torch.nn.utils.clip_grad_norm_``; the probe records the norms first.

    Arguments and return value are torch's: the total norm of the gradients before
    clipping. The step record then carries the unclipped per-layer norms and
    ``clipped`` (the ``max_norm``), so the exploding-gradient rule sees what clipping
    hid.

    Example::

        loss.backward()
        probes.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    """
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    if params:
        for probe in probes_watching(params[0]):
            probe._clipping(float(max_norm))
    return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                          error_if_nonfinite=error_if_nonfinite,
                                          foreach=foreach)
