"""traintop probes: measure a PyTorch training run from inside, cheaply, every step.

Usage::

    import probes

    with probes.watch(model, optimizer, run="mlp-baseline") as probe:
        for batch in loader:
            with probe.step():
                loss = loss_fn(model(batch.x), batch.y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)

The torch-side API is loaded lazily, so that ``import probes.kernel.wire`` (which the monitor
does) never imports torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probes.checks.batch_checks import check_batch
    from probes.checks.data_checks import check_preprocessing, check_split
    from probes.checks.tiny_batch import overfit_batch
    from probes.kernel.diagnosis import Alert, Diagnoser, Thresholds
    from probes.runtime.optimizers.clip import clip_grad_norm_
    from probes.runtime.options import WatchOptions
    from probes.runtime.probe import Probe, watch

__all__ = [
    "Alert",
    "Diagnoser",
    "Probe",
    "Thresholds",
    "WatchOptions",
    "check_batch",
    "check_preprocessing",
    "check_split",
    "clip_grad_norm_",
    "overfit_batch",
    "patched",
    "watch",
]

_LAZY = {
    "Probe": "probes.runtime.probe",
    "watch": "probes.runtime.probe",
    "WatchOptions": "probes.runtime.options",
    "clip_grad_norm_": "probes.runtime.optimizers.clip",
    "patched": "probes.runtime.patches.patches",
    "Alert": "probes.kernel.diagnosis",
    "Diagnoser": "probes.kernel.diagnosis",
    "Thresholds": "probes.kernel.diagnosis",
    "check_split": "probes.checks.data_checks",
    "check_preprocessing": "probes.checks.data_checks",
    "check_batch": "probes.checks.batch_checks",
    "overfit_batch": "probes.checks.tiny_batch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'probes' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
