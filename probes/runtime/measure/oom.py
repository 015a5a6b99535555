"""The report of a step that ran out of memory: an ``out_of_memory`` alert, built from
the error, the memory of the last measured steps and the largest live tensors.

``is_out_of_memory`` tells such an error from others: torch's ``OutOfMemoryError``
(CUDA's, and other devices' allocators), Python's ``MemoryError``, and the
``RuntimeError`` of the CPU allocator (``DefaultCPUAllocator: can't allocate memory``,
which torch 2.x raises as a plain ``RuntimeError``) or any other whose message says out
of memory; an error raised ``from`` one of those counts too.

``oom_alert`` never raises (each piece of evidence it cannot get says so; the alert is
returned with what it could) and is bounded in time. The largest tensors are found in
one pass over ``gc.get_objects()`` that stops after ``SCAN_BUDGET_S`` seconds or
``SCAN_MAX_OBJECTS`` objects (the evidence then says the scan stopped), plus the
model's parameters, gradients, buffers and the optimizer's state, read directly.
Measured on this project's CPU host (tests/runtime/test_oom.py prints it): a process
holding a ~50 MB model and torch's own objects, a few hundred thousand objects, is
scanned in tens of milliseconds. Each storage counts once (by its data pointer), so
views cost nothing. On CUDA the allocator's counters are read, and its snapshot without
traces (``torch.cuda.memory.memory_snapshot(include_traces=False)``, one call whose
cost grows with the allocator's blocks) adds what is reserved and the largest free
block; nothing there initialises CUDA in a process that has not.
"""

from __future__ import annotations

import gc
import itertools
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from probes.kernel.diagnosis.alert import Alert
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity
from probes.kernel.units import human_bytes

#: What a RuntimeError's message says when an allocator ran out (lower case).
OOM_MARKERS = (
    "out of memory",  # CUDA's, HIP's, MPS's, XPU's; "CUDA error: out of memory"
    "can't allocate memory",  # DefaultCPUAllocator
    "cannot allocate memory",  # errno 12's text
    "status_alloc_failed",  # cuBLAS and cuDNN handles that could not be allocated
)
CAUSE_DEPTH = 4  # ``raise ... from`` links followed
ERROR_CHARS = 200  # the error's first line, at most
HISTORY_SHOWN = 5  # memory values shown, the last measured steps'
LARGEST_SHOWN = 5  # groups of tensors shown
SCAN_BUDGET_S = 0.5  # the gc scan stops after this ...
SCAN_MAX_OBJECTS = 5_000_000  # ... or this many objects
SCAN_CHECK_EVERY = 8192  # objects between two looks at the clock
OTHER = "other tensors"
OUTSIDE = "not reachable from Python (autograd's saved tensors, caches)"

_ENFORCE = re.compile(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?")
_T = TypeVar("_T")

StorageKey = tuple[str, int]


def is_out_of_memory(error: BaseException) -> bool:
    """True for an error an allocator raised because memory ran out (or one raised
    ``from`` such an error). Never raises."""
    try:
        current: BaseException | None = error
        for _ in range(CAUSE_DEPTH):
            if current is None:
                return False
            if _is_oom(current):
                return True
            current = current.__cause__
    except Exception:
        pass
    return False


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    for owner in (torch, getattr(torch, "cuda", None)):
        oom_type = getattr(owner, "OutOfMemoryError", None)
        if isinstance(oom_type, type) and isinstance(error, oom_type):
            return True
    if isinstance(error, RuntimeError):
        text = error_line(error, bound=None).lower()
        return any(marker in text for marker in OOM_MARKERS)
    return False


def error_line(error: BaseException, bound: int | None = ERROR_CHARS) -> str:
    """The error's first non-empty line (the CPU allocator's ``[enforce fail at ...]``
    prefix dropped), at most ``bound`` characters; its type's name if it says nothing."""
    try:
        text = str(error)
    except Exception:
        text = ""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    line = _ENFORCE.sub("", line)
    if not line:
        line = type(error).__name__
    if bound is not None and len(line) > bound:
        line = line[: bound - 1] + "…"
    return line


def oom_alert(
    error: BaseException,
    *,
    step: int,
    phase: str,
    history: Sequence[float],
    source: str,
    module: torch.nn.Module | None,
    optimizer: Any = None,
) -> Alert:
    """The ``out_of_memory`` alert for ``error``, raised at ``step`` in ``phase``
    (forward, backward, optimizer, data), its subject the phase.

    ``history`` is the memory of the last measured steps in bytes, oldest first (None or
    NaN for a step not measured); ``source`` says what it measures: ``cuda`` (the
    allocator's bytes) or ``rss`` (the process's resident memory). ``module`` and
    ``optimizer`` (one, or a sequence of them) name the tensors they own. Never raises;
    bounded in time (the module's docstring)."""
    phase_text = phase if isinstance(phase, str) and phase else "unknown"
    line = _attempt(lambda: error_line(error), "unknown")
    try:
        on_cuda = source == "cuda" or "cuda" in line.lower()
        device = _attempt(lambda: _cuda_device(module), None) if on_cuda else None
        values: list[float] = _attempt(lambda: _finite_tail(history), [])
        evidence = {
            "phase": phase_text,
            "error": line,
            "memory": _attempt(lambda: _memory(values, on_cuda, device), "unknown"),
            "peak": _attempt(lambda: _peak(on_cuda, device), "unknown"),
            "history": ", ".join(human_bytes(v) for v in values) or "none measured",
            "largest": _attempt(lambda: largest_tensors(module, optimizer, on_cuda), "unknown"),
        }
        return _alert(_attempt(lambda: int(step), 0), phase_text, evidence)
    except Exception:
        return _alert(0, phase_text, {"phase": phase_text, "error": line})


def _attempt(get: Callable[[], _T], default: _T) -> _T:
    try:
        return get()
    except Exception:
        return default


def _alert(step: int, phase: str, evidence: dict[str, Any]) -> Alert:
    try:
        described = entry(AlertKind.OUT_OF_MEMORY)
        said, experiments = described.said, described.experiments
        severity = described.severity or Severity.ERROR
    except Exception:
        said, experiments, severity = "A step ran out of memory.", (), Severity.ERROR
    return Alert(AlertKind.OUT_OF_MEMORY, severity, step, phase, evidence, said, experiments)


def _finite_tail(history: Sequence[float]) -> list[float]:
    """The last ``HISTORY_SHOWN`` finite values of ``history``, oldest first."""
    values: list[float] = []
    for value in reversed(list(history)):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            continue
        if math.isfinite(number):
            values.append(number)
            if len(values) == HISTORY_SHOWN:
                break
    return values[::-1]


def _memory(values: list[float], on_cuda: bool, device: torch.device | None) -> str:
    """The last measured step's memory; with none measured, the memory held now."""
    if values:
        return human_bytes(values[-1])
    now = _cuda_allocated(device) if on_cuda else _rss_now()
    return "unknown" if now is None else f"{human_bytes(now)} (now: no step measured)"


def _peak(on_cuda: bool, device: torch.device | None) -> str:
    """CUDA: the allocator's peak (and what it reserves, its largest free block);
    else the process's peak resident memory."""
    if not on_cuda:
        peak = _rss_peak()
        return "unknown" if peak is None else human_bytes(peak)
    if not _cuda_ready():
        return "unknown"
    text = human_bytes(torch.cuda.max_memory_allocated(device))
    note = _attempt(lambda: _allocator_note(device), "")
    return f"{text} ({note})" if note else text


def _cuda_ready() -> bool:
    """CUDA is in use here: available and already initialised (never initialised here)."""
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def _cuda_device(module: torch.nn.Module | None) -> torch.device | None:
    """The CUDA device of the module's first CUDA parameter (None: the current one)."""
    if module is None:
        return None
    for param in module.parameters():
        if param.device.type == "cuda":
            return param.device
    return None


def _cuda_allocated(device: torch.device | None) -> int | None:
    return int(torch.cuda.memory_allocated(device)) if _cuda_ready() else None


def _allocator_note(device: torch.device | None) -> str:
    """What the caching allocator reserves on the device and its largest free block,
    from its snapshot without traces ("" where that form does not exist)."""
    try:
        segments = torch.cuda.memory.memory_snapshot(include_traces=False)
    except TypeError:  # a torch without the light form: traces could be costly
        return ""
    index = device.index if device is not None and device.index is not None else None
    if index is None:
        index = torch.cuda.current_device()
    reserved, free = 0, 0
    for segment in segments:
        if segment.get("device", index) != index:
            continue
        reserved += int(segment.get("total_size", 0))
        for block in segment.get("blocks", ()):
            if block.get("state") == "inactive":
                free = max(free, int(block.get("size", 0)))
    return f"reserved {human_bytes(reserved)}, largest free block {human_bytes(free)}"


def _rss_now() -> int | None:
    """The process's resident memory now, in bytes (Linux: /proc/self/statm)."""
    import os

    with open("/proc/self/statm", encoding="ascii") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _rss_peak() -> int | None:
    """The process's peak resident memory, in bytes (ru_maxrss: KiB, bytes on macOS)."""
    import resource  # (not on Windows: the caller's guard says unknown)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def largest_tensors(module: torch.nn.Module | None, optimizer: Any, on_cuda: bool) -> str:
    """``name: size; ...``: the live tensors of the device that ran out (CUDA's, else
    the CPU's), grouped by the module whose parameters, gradients or buffers they are,
    ``<module> (optimizer state)``, or ``other tensors``, largest first; each storage
    counted once. Bounded: see the module's docstring."""
    device_type = "cuda" if on_cuda else "cpu"
    sizes: Counter[str] = Counter()
    counted: set[StorageKey] = set()
    for tensor, label in _owned(module, optimizer):
        _count(tensor, label, device_type, counted, sizes)
    scanned, complete = _scan(device_type, counted, sizes)
    if on_cuda and complete:
        allocated = _attempt(lambda: _cuda_allocated(None), None)
        found = sum(sizes.values())
        if allocated is not None and allocated > found:
            sizes[OUTSIDE] = allocated - found
    groups = [(label, size) for label, size in sizes.most_common(LARGEST_SHOWN) if size > 0]
    text = "; ".join(f"{label}: {human_bytes(size)}" for label, size in groups)
    text = text or f"no {device_type} tensor found"
    if not complete:
        text += f" (scan stopped after {scanned} objects)"
    return text


def _owned(module: torch.nn.Module | None, optimizer: Any) -> Iterator[tuple[Any, str]]:
    """The module's tensors by the name of the module that holds them, then the
    optimizers' state tensors by their parameter's module."""
    owner: dict[int, str] = {}
    if module is not None:
        for name, sub in module.named_modules():
            label = name or type(module).__name__
            for param in sub.parameters(recurse=False):
                owner.setdefault(id(param), label)
                yield param, label
                if param.grad is not None:
                    yield param.grad, label
            for buffer in sub.buffers(recurse=False):
                yield buffer, label
    for one in _optimizers(optimizer):
        state = getattr(one, "state", None)
        items = getattr(state, "items", None)
        if not callable(items):
            continue
        for param, values in list(items()):
            held = owner.get(id(param))
            label = f"{held} (optimizer state)" if held else "optimizer state"
            for value in values.values() if hasattr(values, "values") else ():
                yield value, label


def _optimizers(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    if hasattr(optimizer, "state"):
        return [optimizer]
    return list(optimizer) if isinstance(optimizer, list | tuple) else []


def _count(
    tensor: Any, label: str, device_type: str, counted: set[StorageKey], sizes: Counter[str]
) -> None:
    """Add ``tensor``'s storage to ``label`` unless counted (or not on the device)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != device_type:
        return
    try:
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        nbytes = storage.nbytes()
    except Exception:  # no storage: sparse, meta, a wrapper subclass
        return
    if key[1] and nbytes and key not in counted:
        counted.add(key)
        sizes[label] += nbytes


def _scan(device_type: str, counted: set[StorageKey], sizes: Counter[str]) -> tuple[int, bool]:
    """Count the live tensors the collector tracks that no owner named, as ``OTHER``:
    (objects looked at, whether the scan saw them all)."""
    deadline = time.perf_counter() + SCAN_BUDGET_S
    objects = gc.get_objects()
    tensor_type = torch.Tensor
    total = len(objects)
    for start in range(0, total, SCAN_CHECK_EVERY):  # a chunk at a time, then the clock
        chunk = objects[start : start + SCAN_CHECK_EVERY]
        # The chunk's types are judged once each, by issubclass (isinstance would read
        # __class__, which some objects, torch's deprecated aliases among them, answer
        # with a warning); the tensors are then picked out at C speed.
        kinds = {kind for kind in set(map(type, chunk)) if issubclass(kind, tensor_type)}
        for tensor in itertools.compress(chunk, map(kinds.__contains__, map(type, chunk))):
            _count(tensor, OTHER, device_type, counted, sizes)
        scanned = min(start + SCAN_CHECK_EVERY, total)
        if scanned < total and (scanned >= SCAN_MAX_OBJECTS or time.perf_counter() > deadline):
            return scanned, False
    return total, True
