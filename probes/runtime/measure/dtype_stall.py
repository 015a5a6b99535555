"""Low-precision weights the updates no longer move (rung 5, issue 29): counted on
sampled steps for bfloat16/float16 parameters only, judged in the training process.

An update smaller than half an ulp of a weight in its dtype rounds away: a bfloat16
weight of 1.0 (a LayerNorm gain) ignores any step under 0.004, and pure-bf16 weights
(``model.to(torch.bfloat16)``) under AdamW at a rate meant for float32 stand still
while the version counters say every tensor was written. Per parameter *tensor*, not
per layer (a moving bias must not hide a weight stuck beside it), on a sample of about
``STALL_SAMPLE`` elements (evenly spaced rows, the same elements of the weight and its
gradient): of the elements with a non-zero gradient (an embedding's rows not in the
batch have none), how many ``optimizer.step()`` left bit-identical.

Around the optimizer's step of a sampled step (``probes.runtime.optimizers.optimizer_hooks`` calls
``before`` and ``after``): the sampled weights are copied and the gradient's non-zero
elements marked before it (a few batched ``torch._foreach_*`` ops over the tensors the
stepping optimizer holds), compared after it, and the two counts per tensor launched
to the host without blocking (``host_copy.to_host``): read once landed (at that step on
the CPU; on CUDA at the first step's end that finds its event done; on another device, at
the next sample's), and handed to the judge
(``probes.kernel.diagnosis.precision.LowPrecisionStall``), whose alerts are sent.

A run with no low-precision parameter has no ``DtypeStall`` at all (``of`` gives None):
float32 runs and AMP runs (float32 parameters under autocast) pay nothing. Parameters in
a param group at a rate of 0 are ``updates_not_applied``'s, not counted here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from probes.kernel.diagnosis import Alert
from probes.kernel.diagnosis.precision import LowPrecisionStall
from probes.runtime.measure.host_copy import to_host
from probes.runtime.measure.layers import LayerMap

LOW_PRECISION = (torch.bfloat16, torch.float16)
STALL_SAMPLE = 4096  # elements per tensor counted (all of a smaller one)
PENDING_MAX = 4  # counts launched and not landed yet, kept at most (older ones dropped)

_Pending = tuple[int, list[int], Any, Any]  # step, tensors, values, event


class DtypeStall:
    """Counts, on sampled steps, the elements of each low-precision parameter tensor
    that have a gradient and that the optimizer's step left bit-identical (see the
    module); its judge's alerts go to ``send``.

    Args:
        layers: the watched model's layers; only its low-precision tensors are counted.
        send: called with each alert and the step it is of.
    """

    def __init__(self, layers: LayerMap, send: Callable[[Alert, int], None]) -> None:
        self._send = send
        # the low-precision tensors: index into ``layers.params`` of each
        self._indices = [
            i
            for i, p in enumerate(layers.params)
            if p.dtype in LOW_PRECISION and type(p.detach()) is torch.Tensor  # (no DTensor)
        ]
        self.params = [layers.params[i] for i in self._indices]
        self.judge = LowPrecisionStall(
            [layers.param_names[i] for i in self._indices],
            [layers.names[layers.param_layer[i]] for i in self._indices],
            layers.names,
            [str(p.dtype).removeprefix("torch.") for p in self.params],
        )
        # per optimizer (by id): its groups' sizes, the tensors it holds, the group of
        # each (worked out again when the groups change)
        self._held: dict[int, tuple[tuple[int, ...], list[int], list[int]]] = {}
        # this step's copy: tensors, the weights before, the gradients' non-zero marks
        self._taken: tuple[list[int], Sequence[torch.Tensor], Sequence[torch.Tensor]] | None = None
        self._pending: list[_Pending] = []
        self._rate = 0.0

    @classmethod
    def of(cls, layers: LayerMap, send: Callable[[Alert, int], None]) -> DtypeStall | None:
        """A ``DtypeStall`` for a model with low-precision parameters; None otherwise."""
        if not any(p.dtype in LOW_PRECISION for p in layers.params):
            return None
        made = cls(layers, send)
        return made if made.params else None

    @property
    def taken(self) -> bool:
        """A copy was taken before this optimizer step (``after`` compares it)."""
        return self._taken is not None

    def before(self, optimizer: torch.optim.Optimizer) -> None:
        """A sampled step's optimizer is about to step: copy the sampled weights it
        holds, and mark their gradients' non-zero elements (nothing once said)."""
        if self.judge.said:
            return
        tensors, rates = self._of(optimizer)
        chosen, used = [], []
        for t, rate in zip(tensors, rates, strict=True):
            if rate != 0 and _countable(self.params[t].grad):
                chosen.append(t)
                used.append(rate)
        if not chosen:
            return
        self._rate = max(used)
        with torch.no_grad():
            weights = [_sample(self.params[t].detach()) for t in chosen]
            grads = [_sample(self.params[t].grad) for t in chosen]  # type: ignore[arg-type]
            marks = torch._foreach_abs(torch._foreach_sign(grads))  # 1 where non-zero
            self._taken = (chosen, torch._foreach_mul(weights, 1.0), marks)

    def after(self, step: int) -> None:
        """The optimizer stepped: count what it left unchanged, launch the counts to
        the host, and judge those that landed."""
        taken, self._taken = self._taken, None
        if taken is not None:
            chosen, before, marks = taken
            with torch.no_grad():
                now = [_sample(self.params[t].detach()) for t in chosen]  # (if replaced)
                moved = torch._foreach_sub(now, list(before))
                torch._foreach_sign_(moved)
                torch._foreach_abs_(moved)  # 1 where the weight changed
                torch._foreach_mul_(moved, list(marks))  # ... and had a gradient
                with_grad = torch._foreach_norm(list(marks), 1, dtype=torch.float32)
                changed = torch._foreach_norm(moved, 1, dtype=torch.float32)
                values, event = to_host([*with_grad, *changed])
            self._pending.append((step, chosen, values, event))
            del self._pending[:-PENDING_MAX]
        self._judge_landed()

    @property
    def waiting(self) -> bool:
        """Counts launched and not judged yet (``poll`` judges those that landed)."""
        return bool(self._pending)

    def poll(self) -> None:
        """Judge the counts that have landed (a step after a sampled one, on CUDA: an
        event's query, no sync)."""
        self._judge_landed()

    def discard(self) -> None:
        """Drop a copy taken before a step that did not run its post-hooks."""
        self._taken = None

    def _judge_landed(self) -> None:
        while self._pending:
            step, chosen, values, event = self._pending[0]
            if event is not None and not event.query():
                return  # (later ones were launched after it)
            if event is None and not isinstance(values, list) and len(self._pending) == 1:
                return  # another device, no event: read a sample later, never at once
            self._pending.pop(0)
            numbers = [v.item() for v in values] if isinstance(values, list) else values.tolist()
            count = len(chosen)
            counts = [
                (t, n, n - moved)
                for t, n, moved in zip(chosen, numbers[:count], numbers[count:], strict=True)
            ]
            for alert in self.judge.observe(step, counts, lr=self._rate):
                self._send(alert, step)

    def _of(self, optimizer: torch.optim.Optimizer) -> tuple[list[int], list[float]]:
        """The low-precision tensors ``optimizer`` holds (by their index here), and the
        rate of each one's param group (a tensor rate: taken as non-zero)."""
        groups = optimizer.param_groups
        shape = tuple(len(group["params"]) for group in groups)
        held = self._held.get(id(optimizer))
        if held is None or held[0] != shape:
            group_of = {id(p): g for g, group in enumerate(groups) for p in group["params"]}
            found = [(t, group_of[id(p)]) for t, p in enumerate(self.params) if id(p) in group_of]
            held = (shape, [t for t, _ in found], [g for _, g in found])
            self._held[id(optimizer)] = held
        rates = [groups[g].get("lr", 1.0) for g in held[2]]
        return held[1], [1.0 if isinstance(r, torch.Tensor) else float(r) for r in rates]


def _countable(grad: torch.Tensor | None) -> bool:
    return grad is not None and grad.layout == torch.strided and type(grad) is torch.Tensor


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    """About ``STALL_SAMPLE`` elements of ``tensor``: evenly spaced whole rows (a view
    where it can be), or all of it; the same elements for a tensor of the same shape."""
    rows = tensor.reshape(tensor.shape[0], -1) if tensor.dim() > 1 else tensor.reshape(1, -1)
    count, width = rows.shape
    if count * width <= STALL_SAMPLE:
        return rows
    keep = max(1, STALL_SAMPLE // width)
    return rows[:: max(1, count // keep)]
