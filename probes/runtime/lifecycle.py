"""A run's lifecycle: which probes are open, how a run ended, and closing at exit.

Torch is not imported here: the registry only holds probes, and ``end_reason`` reads
exceptions.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import TYPE_CHECKING, Any

from probes.kernel.endings import bye_reason

if TYPE_CHECKING:
    from probes.runtime.probe import Probe

_open_probes: weakref.WeakSet[Probe] = weakref.WeakSet()


def register(probe: Probe) -> None:
    """A probe opened: it is flushed at interpreter exit unless closed before."""
    _open_probes.add(probe)


def unregister(probe: Probe) -> None:
    """A probe closed."""
    _open_probes.discard(probe)


def probes_watching(param: Any) -> list[Probe]:
    """The open probes whose model trains ``param``."""
    return [probe for probe in list(_open_probes) if probe.owns(param)]


def end_reason(error: BaseException | None) -> str:
    """What the bye says of how the run ended: "closed", "interrupted" or the error."""
    return bye_reason(error)  # the vocabulary both sides share (probes.kernel.endings)


@atexit.register
def _close_open_probes() -> None:
    """Flush probes left open at interpreter exit, so the last steps are not lost; an
    uncaught exception (``sys.last_value``, set before exit handlers run) is the reason."""
    # In an interactive session sys.last_value is any earlier traceback, not the end.
    interactive = hasattr(sys, "ps1") or bool(sys.flags.interactive)
    reason = "closed" if interactive else end_reason(getattr(sys, "last_value", None))
    for probe in list(_open_probes):
        probe._close(reason)
