"""One training step under ``torch.autograd.detect_anomaly``, with forward checks.

Why both: when a NaN is born in the forward pass, anomaly mode blames the last backward
op that saw it (often the loss's), not where it was born; forward hooks on every module
find the first module whose output is non-finite while its inputs were finite. When
the forward is finite and the backward is not, anomaly mode names the backward op and
its forward traceback, which ``locate_module`` maps back to the module whose
``forward`` holds that line.

Everything here is on for one step only: ``AnomalyStep.finish`` turns anomaly mode off,
removes every hook and restores the warning filters.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from probes.kernel.schema import AnomalyReport
from probes.runtime.patches.hooks import compiled_modules, eager
from probes.runtime.patches.module_hooks import ModuleHookHandle, add_hook
from probes.runtime.patches.patches import REGISTRY, Layer
from probes.runtime.patches.seams import BACKWARD

_OP_PATTERN = re.compile(r"Function '(\w+)' returned nan values")
_FRAME_PATTERN = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
_TORCH_PATH = re.compile(r"[/\\]torch[/\\]")


def tensor_stats(tensor: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype and value summary of a tensor (reads it: anomaly steps only)."""
    data = tensor.detach()
    if not data.is_floating_point():
        data = data.float()
    finite = torch.isfinite(data)
    count = data.numel()
    stats: dict[str, Any] = {
        "shape": list(tensor.shape),
        "dtype": str(tensor.dtype).replace("torch.", ""),
        "nan": int(torch.isnan(data).sum()),
        "inf": int(torch.isinf(data).sum()),
        "zeros": int((data == 0).sum()),
        "elements": count,
    }
    values = data[finite]
    if values.numel():
        stats.update(
            min=float(values.min()),
            max=float(values.max()),
            mean=float(values.mean()),
            abs_max=float(values.abs().max()),
        )
    return stats


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def all_finite(values: Iterable[Any]) -> bool:
    """False if a floating or complex tensor among ``values`` holds a NaN or an Inf (a
    host read each: only the anomaly checks call it); other values (None, integer
    tensors) are skipped. The forward checks and the backward locator both ask it."""
    return all(
        bool(torch.isfinite(t.detach()).all())
        for t in values
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
    )


@dataclass
class FirstNonFinite:
    """The first module (in completion order) with finite inputs and a non-finite output."""

    name: str
    type: str
    inputs: list[dict[str, Any]]
    output: dict[str, Any]


@dataclass
class AnomalyStep:
    """Anomaly mode, forward checks and a warning catcher, for exactly one step.

    With ``catch``, the backward that anomaly mode stops is stopped there: its error is
    kept (``caught``), ``on_caught`` is told, and ``backward()`` returns as if it had
    finished. A framework that owns the loop (the HF Trainer, Lightning) then goes on
    to a step the probe has made harmless (no gradients, no update), instead of dying
    of the error. For that one step, ``torch.autograd.backward`` (which
    ``Tensor.backward`` calls) is wrapped; ``finish`` puts it back.
    """

    model: nn.Module
    step: int
    on_error: Callable[[Exception], None] | None = None  # a failing check must not raise
    on_caught: Callable[[BaseException], None] | None = None
    catch: bool = False
    check_nan: bool = True  # False: record forward tracebacks, never stop a backward
    started: float = field(default_factory=time.perf_counter)
    first: FirstNonFinite | None = None
    caught: BaseException | None = None
    _catching: Layer | None = None  # on torch's backward while the step runs
    _handles: list[ModuleHookHandle] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)
    _anomaly: Any = None
    _warnings: Any = None
    _caught: list[warnings.WarningMessage] = field(default_factory=list)

    def start(self) -> None:
        """Turn anomaly mode on and hook every module's forward."""
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        self._anomaly = torch.autograd.detect_anomaly(check_nan=self.check_nan)
        self._anomaly.__enter__()
        compiled = compiled_modules(self.model)  # (their outputs are not checked)
        for name, module in self.model.named_modules():
            self._names[id(module)] = name or "(root)"
            if id(module) not in compiled:
                self._handles.append(
                    add_hook(module, module.register_forward_hook, eager(self._check))
                )
        if self.catch:
            self._catching = REGISTRY.add(
                BACKWARD, Layer("anomaly step", self._backward_catching, order=10)
            )

    def _backward_catching(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """torch's backward; the error anomaly mode raises for a non-finite gradient is
        kept, not raised (the first one: later backwards of the step are not run)."""
        if self.caught is not None:
            return None  # the step's update is already void: no second failure
        try:
            return proceed(*args, **kwargs)
        except RuntimeError as error:
            if backward_op(error) is None:
                raise  # not anomaly mode's: the user's own error
            self.caught = error
            try:
                if self.on_caught is not None:
                    self.on_caught(error)
            except Exception as exc:  # never into the framework's backward
                if self.on_error is not None:
                    self.on_error(exc)
            return None

    def _restore_backward(self) -> None:
        if self._catching is not None:
            REGISTRY.remove(BACKWARD, self._catching)
            self._catching = None

    def _check(self, module: nn.Module, args: Any, output: Any) -> None:
        try:
            self._first_non_finite(module, args, output)
        except Exception as exc:  # a forward hook must never raise into the user's forward
            if self.on_error is not None:
                self.on_error(exc)

    def _first_non_finite(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.first is not None:
            return
        outputs = _tensors(output)
        if all_finite(outputs):
            return
        inputs = _tensors(args)
        if not all_finite(inputs):
            return  # inherited: not born here
        self.first = FirstNonFinite(
            name=self._names.get(id(module), type(module).__name__),
            type=type(module).__name__,
            inputs=[tensor_stats(t) for t in inputs[:4]],
            output=tensor_stats(next(t for t in outputs if not all_finite([t]))),
        )

    def finish(
        self,
        error: BaseException | None,
        *,
        scalars: dict[str, float],
        paused: bool,
        raise_on_anomaly: bool,
    ) -> AnomalyReport:
        """Turn everything off and return the anomaly report (a record)."""
        duration = time.perf_counter() - self.started
        self._restore_backward()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._anomaly is not None:
            self._anomaly.__exit__(None, None, None)
            self._anomaly = None
        caught, self._caught = self._caught, []
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None
        traceback_text = _anomaly_traceback(caught)
        _reemit_other_warnings(caught)
        return self._report(error, traceback_text, duration, scalars, paused, raise_on_anomaly)

    def _report(
        self,
        error: BaseException | None,
        traceback_text: str,
        duration: float,
        scalars: dict[str, float],
        paused: bool,
        raise_on_anomaly: bool,
    ) -> AnomalyReport:
        frames = parse_frames(traceback_text)
        op = backward_op(error)
        outcome = "clean"
        if op is not None:
            outcome = "non_finite_backward"
        elif self.first is not None:
            outcome = "non_finite_forward"
        elif error is not None:
            outcome = "error"
        report: AnomalyReport = {
            "kind": "anomaly",
            "step": self.step,
            "time": time.time(),
            "outcome": outcome,
            "duration": duration,
            "backward_op": op,
            "message": "" if error is None else f"{type(error).__name__}: {error}"[:2000],
            "forward_traceback": user_frames(frames),
            "first_non_finite": None if self.first is None else self.first.__dict__,
            "module_of_backward_op": locate_module(self.model, frames),
            "update_skipped": op is not None or error is not None,
            "paused": paused,
            "raised": raise_on_anomaly and error is not None,
        }
        batch = scalars.get("batch", scalars.get("batch_index"))
        if batch is not None and math.isfinite(batch):
            report["batch"] = int(batch)
        return report


def backward_op(error: BaseException | None) -> str | None:
    """The backward function anomaly mode blamed, from its error message."""
    if error is None:
        return None
    match = _OP_PATTERN.search(str(error))
    return match.group(1) if match else None


def _anomaly_traceback(caught: list[warnings.WarningMessage]) -> str:
    for message in caught:
        text = str(message.message)
        if "Traceback of forward call that caused the error" in text:
            return text
    return ""


def _reemit_other_warnings(caught: list[warnings.WarningMessage]) -> None:
    """Warnings of the user's code during the step were caught with ours: show them."""
    for message in caught:
        text = str(message.message)
        if "Anomaly Detection has been enabled" in text or "Traceback of forward call" in text:
            continue
        warnings.warn_explicit(message.message, message.category, message.filename, message.lineno)


def parse_frames(traceback_text: str) -> list[dict[str, Any]]:
    """The forward traceback's frames, outermost first: file, line, function, code."""
    frames: list[dict[str, Any]] = []
    lines = traceback_text.splitlines()
    for index, line in enumerate(lines):
        match = _FRAME_PATTERN.match(line)
        if not match:
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        code = "" if _FRAME_PATTERN.match(following) else following.strip()
        frames.append(
            {
                "file": match.group(1),
                "line": int(match.group(2)),
                "function": match.group(3),
                "code": code,
            }
        )
    return frames


def user_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames of a forward traceback that are the user's code (not torch's)."""
    return [
        f for f in frames if not _TORCH_PATH.search(f["file"]) and not f["file"].startswith("<")
    ]


def locate_module(model: nn.Module, frames: list[dict[str, Any]]) -> str | None:
    """The module whose ``forward`` contains the innermost frame that is in one (the
    first such module when several instances share a class)."""
    spans: list[tuple[str, str, int, int]] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Sequential):
            continue  # a container's forward only passes values on
        code = getattr(type(module).forward, "__code__", None)
        if code is None:
            continue
        lines = [line for _, _, line in code.co_lines() if line is not None]
        if lines:
            spans.append((name or "(root)", code.co_filename, min(lines), max(lines)))
    for frame in reversed(frames):
        for name, filename, first, last in spans:
            if frame["file"] == filename and first <= frame["line"] <= last:
                return name
    return None
