"""Per-step measurements without a host/device synchronisation.

The training thread calls ``measure_step``: one ``torch._foreach_norm`` per
(device, dtype) group over all gradients (and, on sampled steps, all parameters),
concatenated with the step's tensor scalars into one vector, copied to host memory
with ``non_blocking=True``. The result is a ``Measurement`` that the sender thread
turns into a step record once the copy has landed (``ready()``), one step or more
later; the training thread never waits for the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from probes.layers import LayerMap, combine_layer_norms


@dataclass
class Measurement:
    """One step's numbers, possibly still on their way to host memory."""

    layer_map: LayerMap
    step: int
    time: float
    duration: float
    values: torch.Tensor | None
    event: torch.cuda.Event | None = None
    grad_present: tuple[int, ...] | None = None  # None: every parameter had a gradient
    grad_count: int = 0
    param_count: int = 0  # >0 on sampled steps: parameter norms follow the grad norms
    param_order: tuple[int, ...] | None = None  # parameter order of the values, if not natural
    tensor_scalar_names: tuple[str, ...] = ()
    float_scalars: dict[str, float] = field(default_factory=dict)
    lrs: list[float] = field(default_factory=list)
    none_grads: int = 0
    late_scalars: dict[str, torch.Tensor] = field(default_factory=dict)  # logged after the step

    def ready(self) -> bool:
        """True once ``values`` can be read without waiting for the device."""
        return self.event is None or self.event.query()

    def to_record(self) -> dict[str, object]:
        """The step record (a dict of plain numbers); waits for the copy if needed."""
        layer_map = self.layer_map
        if self.event is not None:
            self.event.synchronize()
        values: list[float] = [] if self.values is None else self.values.tolist()
        grads = values[: self.grad_count]
        params = values[self.grad_count : self.grad_count + self.param_count]
        tail = values[self.grad_count + self.param_count :]
        scalars: dict[str, float] = {}
        lrs = list(self.lrs)
        for name, value in zip(self.tensor_scalar_names, tail, strict=True):
            if name.startswith("lr/"):
                lrs[int(name[3:])] = value
            else:
                scalars[name] = value
        scalars.update(self.float_scalars)
        scalars.update({name: float(t) for name, t in self.late_scalars.items()})
        grad_norms = combine_layer_norms(grads, self.grad_present, layer_map)
        record: dict[str, object] = {
            "kind": "step",
            "step": self.step,
            "time": self.time,
            "duration": self.duration,
            "scalars": _loss_first(scalars),
            "lr": lrs,
            "grad_norms": grad_norms,
            "grad_norm_total": _total(grads),
            "none_grads": self.none_grads,
        }
        if self.param_count:
            record["param_norms"] = combine_layer_norms(params, self.param_order, layer_map)
        return record


def _loss_first(scalars: dict[str, float]) -> dict[str, float]:
    if "loss" not in scalars or next(iter(scalars)) == "loss":
        return scalars
    return {"loss": scalars["loss"], **{k: v for k, v in scalars.items() if k != "loss"}}


def _total(norms: list[float]) -> float | None:
    if not norms:
        return None
    return math.sqrt(math.fsum(n * n for n in norms))


def batched_norms(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """L2 norm of each tensor, one ``_foreach_norm`` per (device, dtype) group.

    Returns:
        A 1-D tensor of norms on the first tensor's device (float32, or float64 when
        any input is float64), and the input index of each entry when the grouping
        reordered them (None when the order is the input order).
    """
    first = tensors[0]
    wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    if all(t.device == first.device and t.dtype == first.dtype for t in tensors):
        norms = torch._foreach_norm(tensors, 2, dtype=wide)
        return torch.stack(norms), None
    grouped = torch.utils._foreach_utils._group_tensors_by_device_and_dtype(
        [tensors], with_indices=True
    )
    parts: list[torch.Tensor] = []
    order: list[int] = []
    for (_device, _dtype), ([group], indices) in grouped.items():
        norms = torch._foreach_norm(group, 2, dtype=wide)
        parts.append(torch.stack(norms).to(first.device, non_blocking=True))
        order.extend(indices)
    return torch.cat(parts), tuple(order)


def compose_order(
    present: tuple[int, ...] | None, order: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """Parameter indices of the norm values, given which were present and how grouped."""
    if order is None:
        return present
    if present is None:
        return order
    return tuple(present[i] for i in order)


def to_host(vector: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start copying ``vector`` to host memory; return the host tensor and its event.

    On the CPU this is the vector itself. On CUDA the copy goes to pinned memory
    without blocking, and the returned event tells when it has landed.
    """
    if vector.device.type == "cpu":
        return vector, None
    if vector.device.type == "cuda":
        host = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
        host.copy_(vector, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event
    # Other accelerators: a blocking copy, made later on the sender thread.
    return vector, None
