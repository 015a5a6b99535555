"""A run's lifecycle: which probes are open, how a run ended, and closing at exit.

Torch is not imported here: the registry only holds probes, and ``end_reason`` reads
exceptions (an out-of-memory error escaping the script is told by
``probes.runtime.measure.oom``, imported only then, when torch is loaded). Nor is the
probe's module: the registry knows a probe by what it asks of one (``OpenProbe``), so
the probe and the clip, which both use this, never import each other through it.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import weakref
from typing import Any, Protocol

from probes.kernel.endings import bye_reason


class OpenProbe(Protocol):
    """What the registry and the clip (``probes.runtime.optimizers.clip``) ask of an open probe."""

    def owns(self, param: Any) -> bool: ...

    def clipping(self, max_norm: float, norm_type: float = 2.0) -> None: ...

    def clipped(self, total_norm: Any) -> None: ...

    def close_with_reason(self, reason: str) -> None: ...


_open_probes: weakref.WeakSet[OpenProbe] = weakref.WeakSet()


def register(probe: OpenProbe) -> None:
    """A probe opened: it is flushed at interpreter exit unless closed before."""
    _open_probes.add(probe)


def unregister(probe: OpenProbe) -> None:
    """A probe closed."""
    _open_probes.discard(probe)


def open_probes() -> list[OpenProbe]:
    """The probes open now."""
    return list(_open_probes)


def probes_watching(param: Any) -> list[OpenProbe]:
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
    error = None if interactive else getattr(sys, "last_value", None)
    reason = "closed" if interactive else end_reason(error)
    if isinstance(error, BaseException):
        report_out_of_memory(error)
    for probe in list(_open_probes):
        probe.close_with_reason(reason)


def report_out_of_memory(error: BaseException) -> None:
    """An out-of-memory error escaped the script (``traintop run``'s, or any watched
    one): each open probe that can report it (``report_out_of_memory(error)``) does,
    before it is closed. The process then ends as it would have: the traceback is
    already printed, the exit status is Python's. Never raises."""
    if "torch" not in sys.modules:  # (no probe without torch: nothing to report)
        return
    try:
        from probes.runtime.measure.oom import is_out_of_memory

        if not is_out_of_memory(error):
            return
    except Exception:
        return
    for probe in list(_open_probes):
        report = getattr(probe, "report_out_of_memory", None)
        if callable(report):
            with contextlib.suppress(Exception):  # (never changes how the process ends)
                report(error)
