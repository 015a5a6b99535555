"""The memory of a step, read where it costs nothing: the CUDA allocator's counters for a
model on a CUDA device (host-side numbers, no sync), else the process's resident memory
(Linux: ``/proc/self/statm``, read through a file kept open, about 3 microseconds;
elsewhere the peak from ``getrusage``, the closest the standard library has).

The allocator's peak is the run's own (``torch.cuda.max_memory_allocated``): the probe
never resets it, since the training code may read it too.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from typing import Any

import torch
from torch import nn

CUDA = "cuda"
RSS = "rss"


class MemoryGauge:
    """Reads a step's memory into its record (``read``); ``source`` says what it is."""

    def __init__(self, module: nn.Module) -> None:
        self.device: torch.device | None = _cuda_device(module)
        self.source = CUDA if self.device is not None else RSS
        self._statm: int | None = None
        self._page = 4096
        if self.device is None and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, ValueError):
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
                self._page = os.sysconf("SC_PAGE_SIZE")

    def read(self, into: dict[str, Any]) -> None:
        """This moment's memory, as the record's fields, ``into`` it."""
        if self.device is not None:
            into["memory"] = float(torch.cuda.memory_allocated(self.device))
            into["memory_reserved"] = float(torch.cuda.memory_reserved(self.device))
            into["memory_peak"] = float(torch.cuda.max_memory_allocated(self.device))
        else:
            into["memory"] = self.resident()

    def resident(self) -> float:
        """The process's resident bytes (its peak where the current figure is not known)."""
        if self._statm is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return float(int(os.pread(self._statm, 64, 0).split()[1]) * self._page)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak if sys.platform == "darwin" else peak * 1024)  # (KiB on Linux)

    def close(self) -> None:
        statm, self._statm = self._statm, None
        if statm is not None:
            with contextlib.suppress(OSError):
                os.close(statm)


def _cuda_device(module: nn.Module) -> torch.device | None:
    """The CUDA device of the model's first parameter (None: none, or not on CUDA)."""
    for param in module.parameters():
        return param.device if param.device.type == "cuda" else None
    return None
