"""The scoped check armed by a non-finite value: the producer named without a key press.

When the sender's delayed read of a step (``probes.runtime.measure.stats``: read a step or more
later, never on the training thread's step) shows a non-finite number, ``AutoAnomaly``
arms, once per incident, one check of the next step the training thread begins:

- forward hooks on every module find the first module whose output is non-finite while
  its inputs were finite (``AnomalyStep``'s forward checks);
- anomaly mode records each op's forward traceback (``check_nan=False``: it never
  stops a backward), and hooks on every node of the step's backward graphs name the
  first op whose incoming gradients were finite and whose outgoing ones were not: the
  producer of a NaN born in backward, its forward line and the module holding it.

Unlike the ``a`` key's anomaly step, the check only observes: no backward is stopped,
no update skipped, no pause; nothing it does raises into the training loop (a failure
switches the automatic check off with one line). It costs the one step it runs on (a
host read per module output and per backward node), which the report says.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.kernel.schema import AnomalyReport
from probes.runtime.anomaly.anomaly import (
    AnomalyStep,
    all_finite,
    locate_module,
    parse_frames,
    user_frames,
)
from probes.runtime.link.sender import warn
from probes.runtime.patches.patches import REGISTRY, Layer
from probes.runtime.patches.seams import BACKWARD

#: Steps without a non-finite read before a new non-finite value is a new incident (and
#: arms a check again): a run whose values stay NaN is checked once, not every step.
REARM_AFTER_STEPS = 100

#: What the report says the check cost.
COST = "one step: a forward hook per module, a backward hook per op, a host read each"


class AutoAnomaly:
    """When to run the scoped check: armed from the sender's thread, taken at a step's
    start on the training thread (a flag each way, no lock on the training path)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        # the non-finite step that armed a check (read each step: a plain attribute)
        self.pending: int | None = None
        self._quiet_until = -1  # non-finite steps up to here belong to the last incident

    def saw_non_finite(self, step: int) -> None:
        """The delayed read of ``step`` shows a non-finite number (the sender's thread)."""
        if not self.enabled:
            return
        if step > self._quiet_until:
            self.pending = step
        self._quiet_until = max(self._quiet_until, step + REARM_AFTER_STEPS)

    def covered(self, step: int) -> None:
        """An anomaly step (the ``a`` key's) runs at ``step``: what turns non-finite
        there or soon after is its to report, not a second check's."""
        self.pending = None
        self._quiet_until = max(self._quiet_until, step + REARM_AFTER_STEPS)

    def take(self) -> int | None:
        """The step that armed a check, once (None: none armed)."""
        pending, self.pending = self.pending, None
        return pending if self.enabled else None

    def switch_off(self, reason: BaseException) -> None:
        """The check failed: no more automatic checks in this run (training goes on)."""
        if self.enabled:
            self.enabled = False
            warn(f"the automatic non-finite check is off after an internal error: {reason!r}")


class BackwardLocator:
    """For one step, the first backward node (in the order backward ran them) whose
    incoming gradients were finite and whose outgoing ones were not."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.on_error = on_error
        self.op: str | None = None
        self.traceback: list[str] = []
        self._layer: Layer | None = None
        self._handles: list[RemovableHandle] = []

    def start(self) -> None:
        """Stand in for ``torch.autograd.backward`` (``Tensor.backward`` calls it)."""
        self._layer = REGISTRY.add(BACKWARD, Layer("non-finite check", self._hooked_backward, 20))

    def finish(self) -> None:
        """Put torch's backward back; remove every hook left on a retained graph."""
        if self._layer is not None:
            REGISTRY.remove(BACKWARD, self._layer)
            self._layer = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hooked_backward(
        self, proceed: Callable[..., Any], tensors: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if self.op is None:
            try:
                self._hook_graph(tensors)
            except Exception as exc:  # never into the user's backward
                self.on_error(exc)
        return proceed(tensors, *args, **kwargs)

    def _hook_graph(self, tensors: Any) -> None:
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor)]
        seen: set[Any] = set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            self._handles.append(node.register_hook(self._watch(node)))
            stack.extend(next_node for next_node, _ in node.next_functions)

    def _watch(self, node: Any) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        def hook(grad_inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> None:
            try:
                if self.op is None and all_finite(grad_outputs) and not all_finite(grad_inputs):
                    self.op = str(node.name())
                    self.traceback = list(node.metadata.get("traceback_") or ())
            except Exception as exc:  # a backward hook must never raise into backward
                self.on_error(exc)

        return hook


class ScopedCheck:
    """The check of one step: forward checks on every module and the backward locator
    (see the module), observing only."""

    def __init__(
        self,
        model: nn.Module,
        step: int,
        armed_by: int,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.model = model
        self.armed_by = armed_by
        self._forward = AnomalyStep(model, step, on_error=on_error, check_nan=False)
        self._backward = BackwardLocator(on_error)

    def start(self) -> None:
        self._forward.start()
        self._backward.start()

    def finish(self, scalars: dict[str, float]) -> AnomalyReport:
        """Everything off; the report (an ``anomaly`` record, ``auto`` set)."""
        started = self._forward.started
        self._backward.finish()
        report = self._forward.finish(None, scalars=scalars, paused=False, raise_on_anomaly=False)
        located = self._backward
        if located.op is not None and report["first_non_finite"] is None:
            frames = parse_frames("".join(located.traceback))
            report["outcome"] = "non_finite_backward"
            report["backward_op"] = located.op
            report["message"] = f"Function '{located.op}' returned nan values (observed)"
            report["forward_traceback"] = user_frames(frames)
            report["module_of_backward_op"] = locate_module(self.model, frames)
        report["update_skipped"] = False
        report["duration"] = time.perf_counter() - started
        report["auto"] = {"armed_by": self.armed_by, "cost": COST}
        return report
