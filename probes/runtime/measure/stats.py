"""Per-step measurements without a host/device synchronisation.

The training thread launches one ``torch._foreach_norm`` per (device, dtype) group
over all gradients (and, on sampled steps, all parameters); on an accelerator the
norms and the step's tensor scalars are stacked into one vector and copied to host
memory with ``non_blocking=True``. The result is a ``Measurement`` that the sender thread
turns into a step record once the copy has landed (``ready()``), one step or more
later; the training thread never waits for the device.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, cast

import torch

from probes.kernel.merge import apply as apply_merged
from probes.kernel.schema.records import ClipFields, StepRecord
from probes.runtime.measure.layers import LayerMap, combine_layer_norms, combine_layer_peaks

if TYPE_CHECKING:
    from probes.runtime.measure.host_copy import HostRing

#: The name a clip's total norm (torch's, before clipping) travels under among a step's
#: tensor scalars, to the host with the rest; it becomes the record's ``clip`` field.
CLIP_TOTAL = "clip/total"
#: ... and the RMS of the model's input on a sampled step (the record's ``input_rms``).
INPUT_RMS = "input/rms"
#: ... and a rank's own gradient norm before the all-reduce
#: (``probes.runtime.measure.local_grads``).
LOCAL_GRAD_NORM = "local/grad_norm"

#: The sections of a step's copied values (``ValuesLayout``), as the measurer appends
#: them: per-parameter gradient norms; on a measured update, its changes' then its
#: weights' norms (``probes.runtime.measure.sampled.UpdateNorms``); on sampled steps,
#: the per-parameter weight norms and the activations' hit counts.
GRADS = "grads"
UPDATES = "updates"
PARAMS = "params"
ACTIVATIONS = "activations"
#: ... and, on sampled steps, each gradient's largest element, unclipped (``grad_max``).
GRAD_MAX = "grad_max"


class ValuesLayout:
    """Where each section of a step's values lies in the one vector copied to the host:
    the sections in the order the measurer appended them, then the tensor scalars.
    The record, the merge and the peaks all read the values through it, so a new
    measured section is one ``add`` where it is appended and one ``of`` where it is
    read."""

    __slots__ = ("_spans", "size")

    def __init__(self) -> None:
        self._spans: dict[str, tuple[int, int]] = {}
        self.size = 0  # values in the sections; the tensor scalars follow

    def add(self, section: str, count: int) -> None:
        """``count`` values of ``section`` were appended after the others."""
        self._spans[section] = (self.size, self.size + count)
        self.size += count

    def count(self, section: str) -> int:
        """How many values ``section`` holds (0: not measured this step)."""
        span = self._spans.get(section)
        return 0 if span is None else span[1] - span[0]

    def of(self, values: list[float], section: str) -> list[float]:
        """``section``'s values, read from the host copy."""
        span = self._spans.get(section)
        return [] if span is None else values[span[0] : span[1]]

    def scalars(self, values: list[float]) -> list[float]:
        """The tensor scalars' values (named by ``Measurement.tensor_scalar_names``)."""
        return values[self.size :]


class Measurement:
    """One step's numbers: filled in on the training thread as the step runs (0-d
    tensors, nothing read), then read by the sender once the copy has landed.

    A plain slotted class with defaults set in ``__init__``: one is made per step, and a
    dataclass with default factories costs several microseconds more.
    """

    __slots__ = (
        "_grad_layers",
        "_host",
        "_non_finite",
        "activation_totals",
        "clip_norm_type",
        "clip_total",
        "clipped",
        "duration",
        "event",
        "float_scalars",
        "grad_max",
        "grad_max_order",
        "grad_norms",
        "grad_order",
        "grad_present",
        "grads_read",
        "grads_scaled",
        "input_rms",
        "late_scalars",
        "layer_map",
        "layer_values",
        "layout",
        "local_grad_norm",
        "lrs",
        "merged",
        "none_grads",
        "not_cleared",
        "not_stepped",
        "optimizer_step",
        "param_order",
        "probe_time",
        "ring",
        "sampled",
        "span",
        "step",
        "tensor_scalar_names",
        "tensor_scalars",
        "time",
        "update_norms",
        "update_order",
        "values",
    )

    def __init__(self, layer_map: LayerMap, step: int, time: float, sampled: bool) -> None:
        self.layer_map = layer_map
        self.step = step
        self.time = time
        self.sampled = sampled  # costlier statistics are taken on this step
        self.duration = 0.0  # the step's wall seconds, the probe's own time included
        self.probe_time = 0.0  # the probe's seconds on the training thread (+ the sender's)
        # launched during the step
        self.grads_read = False
        self.grad_norms: list[torch.Tensor] = []
        self.grad_present: tuple[int, ...] | None = None  # None: every parameter had a grad
        self.grad_order: tuple[int, ...] | None = None
        self.none_grads = 0
        # sampled steps: each gradient's largest |element| (the ``grad_norms``' present)
        self.grad_max: list[torch.Tensor] = []
        self.grad_max_order: tuple[int, ...] | None = None
        self.not_cleared = False  # the last step's gradient was never cleared
        self.clipped: float | None = None  # max_norm of a clip_grad_norm_ in the step
        self.clip_norm_type = 2.0
        self.clip_total: float | None = None  # torch's total norm before the clip (CPU)
        self.input_rms: float | None = None  # the model's input scale, sampled steps (CPU)
        self.local_grad_norm: float | None = None  # this rank's, before the all-reduce (CPU)
        # A GradScaler's scale still in the gradients when clipped or read (no unscale_)
        self.grads_scaled: float | None = None
        # Did optimizer.step() run? None: no optimizer watched. False: AMP's GradScaler
        # skipped it (non-finite gradients), or the loop accumulates this step.
        self.optimizer_step: bool | None = None
        self.update_norms: list[torch.Tensor] | None = None
        self.update_order: tuple[int, ...] | None = None
        self.tensor_scalars: dict[str, torch.Tensor] = {}
        self.float_scalars: dict[str, float] = {}
        self.late_scalars: dict[str, torch.Tensor] = {}  # logged after the step's block
        # set when the step ends: the layout of ``values``
        self.values: torch.Tensor | list[torch.Tensor] | None = None  # see ``to_host``
        self.event: torch.cuda.Event | None = None
        self.ring: HostRing | None = None  # where ``values`` and ``event`` go back, once read
        self.layout = ValuesLayout()  # the sections of ``values``, as the step ends
        self.param_order: tuple[int, ...] | None = None
        self.activation_totals: list[int] = []  # elements seen per activation module
        self.tensor_scalar_names: tuple[str, ...] = ()
        self.lrs: list[float] = []
        self.span: tuple[int, int] | None = None  # set when it stands for several steps
        self.merged: dict[str, object] | None = None  # ... with their peaks (thinning)
        self.not_stepped: list[int] | None = None  # layers optimizer.step() left alone
        # Per-layer fields of the spec known on the host as the step ends (no copy to
        # wait for), by name: written into the record and merged as the spec says.
        # per-layer lists by field (and a few host values the step's update says:
        # ``undivided_passes``, ``loss_reduction``, ``optimizer_state``, ...)
        self.layer_values: dict[str, Any] = {}
        self._host: list[float] | None = None
        self._non_finite: bool | None = None  # (``has_non_finite``, once read)
        # The per-layer gradient norms and their total, made once (thinning reads them,
        # and the record of a step sent is made of them again).
        self._grad_layers: tuple[list[float | None], float | None] | None = None

    def has_non_finite(self) -> bool:
        """True if any norm or scalar of the step is NaN or Inf (cheap: one sum, once:
        the sender asks twice of every step, and nothing changes once it is queued)."""
        if self._non_finite is None:
            total = sum(self._values()) + sum(self.float_scalars.values())
            total += sum(float(t) for t in self.late_scalars.values())
            self._non_finite = not math.isfinite(total)
        return self._non_finite

    def _values(self) -> list[float]:
        if self._host is None:
            if self.event is not None and not self.event.query():
                self.event.synchronize()  # only when forced (closing, far behind)
            if self.values is None:
                self._host = []
            elif not isinstance(self.values, list):
                self._host = self.values.tolist()
                if self.ring is not None and self.event is not None:  # read: reusable now
                    self.ring.give_back(self.values, self.event)
                    self.values, self.event, self.ring = None, None, None
            else:  # 0-d CPU tensors: read one by one in C (stacking them costs more)
                self._host = list(map(torch.Tensor.item, self.values))
        return self._host

    def _grads_by_layer(self) -> tuple[list[float | None], float | None]:
        """The per-layer gradient norms and their total (made once)."""
        if self._grad_layers is None:
            grads = self.layout.of(self._values(), GRADS)
            layers = combine_layer_norms(grads, self.grad_present, self.layer_map)
            self._grad_layers = layers, _total(grads)
        return self._grad_layers

    def ready(self) -> bool:
        """True once ``values`` can be read without waiting for the device."""
        return self._host is not None or self.event is None or self.event.query()

    def to_record(self) -> dict[str, Any]:
        """The step record (a dict of plain numbers); waits for the copy if needed."""
        layers, layout = self.layer_map, self.layout
        values = self._values()
        grad_layers, grad_total = self._grads_by_layer()
        tail = layout.scalars(values)
        record: StepRecord = {
            "kind": "step",
            "step": self.step,
            "time": self.time,
            "duration": self.duration,
            "probe_time": self.probe_time,
            "scalars": self._scalars(tail),
            "lr": self._lrs(tail),
            "grad_norms": list(grad_layers),  # (its own list: merging writes over it)
            "grad_norm_total": grad_total,
            "none_grads": self.none_grads,
        }
        if self.grad_present is not None and self.none_grads:
            present = set(self.grad_present)
            record["none_grad_params"] = [i for i in range(len(layers.params)) if i not in present]
        if layout.count(PARAMS):
            params = layout.of(values, PARAMS)
            record["param_norms"] = combine_layer_norms(params, self.param_order, layers)
        if layout.count(GRAD_MAX):
            record["grad_max"] = self._grad_max(values)
        if layout.count(UPDATES):
            record["update_ratios"] = self._update_ratios(layout.of(values, UPDATES))
        if self.activation_totals:
            counts = layout.of(values, ACTIVATIONS)
            record["activations"] = _fractions(counts, self.activation_totals)
        if self.not_cleared:
            record["grads_not_cleared"] = True
        if self.clipped is not None:
            clip = record["clip"] = self._clip(tail)
            record["clip_steps"], record["clip_active_steps"] = _clip_counts(clip)
        if self.grads_scaled is not None:
            record["grads_scaled"] = self.grads_scaled
        if self.optimizer_step is False:
            record["optimizer_step"] = False
        if self.not_stepped:
            record["not_stepped"] = self.not_stepped
        input_rms = self._tensor_scalar(tail, INPUT_RMS, self.input_rms)
        if input_rms is not None:
            record["input_rms"] = input_rms
        local = self._tensor_scalar(tail, LOCAL_GRAD_NORM, self.local_grad_norm)
        if local is not None:
            record["local_grad_norm"] = local
        if self.span is not None:
            record["span"] = list(self.span)
        plain = cast(dict[str, Any], record)  # (the sender adds its own fields: seq, ...)
        plain.update(self.layer_values)
        if self.merged is not None:
            apply_merged(plain, self.merged)
        return plain

    def merge_values(self) -> dict[str, Any]:
        """The fields a merged record is made of (``probes.kernel.merge``): the
        gradient norms, their total and the scalars (their peaks), the durations, the
        update flags and the host-side per-layer values. Waits for the copy if needed."""
        grads, total, scalars = self._peak_values()
        clip: dict[str, Any] = {}
        if self.clipped is not None:
            tail = self.layout.scalars(self._values())
            clipped, active = _clip_counts(self._clip(tail))
            clip = {"clip_steps": clipped, "clip_active_steps": active}
        peaks: dict[str, Any] = {}
        if self.layout.count(GRAD_MAX):  # (a thinned record: the span's largest)
            peaks["grad_max"] = self._grad_max(self._values())
        return {
            **clip,
            **peaks,
            "grads_scaled": self.grads_scaled,
            "grad_norms": grads,
            "grad_norm_total": total,
            "scalars": scalars,
            "duration": self.duration,
            "probe_time": self.probe_time,
            "optimizer_step": self.optimizer_step,
            "grads_not_cleared": self.not_cleared,
            "not_stepped": self.not_stepped,
            **self.layer_values,
        }

    def _peak_values(self) -> tuple[list[float | None], float | None, dict[str, float]]:
        layers, total = self._grads_by_layer()
        scalars = (
            self._scalars(self.layout.scalars(self._values()))
            if self.tensor_scalar_names or self.late_scalars
            else self.float_scalars
        )
        return layers, total, scalars

    def _grad_max(self, values: list[float]) -> list[float | None]:
        """Per layer, its gradients' largest |element| (sampled steps)."""
        peaks = self.layout.of(values, GRAD_MAX)
        return combine_layer_peaks(peaks, self.grad_max_order, self.layer_map)

    def _update_ratios(self, updates: list[float]) -> list[float | None]:
        """Per layer |dw|/|w|: the values are the sampled changes, then the sampled
        weights (see ``probes.runtime.measure.sampled.UpdateNorms``), in ``update_order``."""
        count = len(self.layer_map.params)
        order = self.update_order
        if order is None:
            order = tuple(range(2 * count))
        changes = [v for v, i in zip(updates, order, strict=True) if i < count]
        weights = [v for v, i in zip(updates, order, strict=True) if i >= count]
        change_order = tuple(i for i in order if i < count)
        weight_order = tuple(i - count for i in order if i >= count)
        per_layer_change = combine_layer_norms(changes, change_order, self.layer_map)
        per_layer_weight = combine_layer_norms(weights, weight_order, self.layer_map)
        return [_ratio(u, w) for u, w in zip(per_layer_change, per_layer_weight, strict=True)]

    def _clip(self, tail: list[float]) -> ClipFields:
        """Max norm and norm type of the clip; torch's total norm before it, and the
        total it scaled the gradients to (torch multiplies by max_norm / (total + 1e-6)
        when that is below 1)."""
        total = self.clip_total
        for name, value in zip(self.tensor_scalar_names, tail, strict=True):
            if name == CLIP_TOTAL:
                total = value
        max_norm = float(self.clipped or 0.0)
        after = None
        if total is not None:
            after = total * min(1.0, max_norm / (total + 1e-6)) if math.isfinite(total) else total
        return {
            "max_norm": max_norm,
            "norm_type": self.clip_norm_type,
            "total_before": total,
            "total_after": after,
        }

    def _tensor_scalar(self, tail: list[float], wanted: str, on_cpu: float | None) -> float | None:
        """A named tensor scalar that came with the copy, else its CPU reading."""
        for name, value in zip(self.tensor_scalar_names, tail, strict=True):
            if name == wanted:
                return value
        return on_cpu

    def _scalars(self, tail: list[float]) -> dict[str, float]:
        scalars = {
            name: value
            for name, value in zip(self.tensor_scalar_names, tail, strict=True)
            if not name.startswith(("lr/", "clip/", "input/", "local/"))
        }
        scalars.update(self.float_scalars)
        scalars.update({name: float(t) for name, t in self.late_scalars.items()})
        return _loss_first(scalars)

    def _lrs(self, tail: list[float]) -> list[float]:
        lrs = list(self.lrs)
        for name, value in zip(self.tensor_scalar_names, tail, strict=True):
            if name.startswith("lr/"):
                lrs[int(name[3:])] = value
        return lrs


def _ratio(update: float | None, weight: float | None) -> float | None:
    if update is None or weight is None:
        return None
    return update / weight if weight else None  # all-zero weights: no ratio, not infinite


def _fractions(counts: list[float], totals: list[int]) -> list[float | None]:
    """Per activation module: hits / elements, None for a module that did not run."""
    out: list[float | None] = []
    remaining = iter(counts)
    for total in totals:
        out.append(next(remaining) / total if total else None)
    return out


def _loss_first(scalars: dict[str, float]) -> dict[str, float]:
    if "loss" not in scalars or next(iter(scalars)) == "loss":
        return scalars
    return {"loss": scalars["loss"], **{k: v for k, v in scalars.items() if k != "loss"}}


def _total(norms: list[float]) -> float | None:
    if not norms:
        return None
    return math.sqrt(math.fsum(map(operator.mul, norms, norms)))


class NormReducer:
    """L2 norm of each tensor of a list, one ``_foreach_norm`` per (device, dtype) group.

    Whether a list is all of one device and dtype is decided once per kind of list
    and cached: checking every tensor on every step costs more than the norms of a
    small model.
    """

    def __init__(self) -> None:
        self._plans: dict[tuple[object, ...], tuple[bool, torch.dtype, bool]] = {}

    def norms(
        self, tensors: list[torch.Tensor], ord: float = 2.0
    ) -> tuple[list[torch.Tensor], tuple[int, ...] | None]:
        """0-d norm tensors on the first tensor's device, and their input order.

        The norms are float32, or float64 when any input is float64; ``ord`` is the
        norm's (``math.inf``: the largest |element|). The order returned is the input
        index of each norm when grouping reordered them, else None.
        """
        first, last = tensors[0], tensors[-1]
        # A list's kind: its length and the device/dtype at both ends (a model moved
        # or cast as a whole changes these).
        key = (len(tensors), first.get_device(), first.dtype, last.get_device(), last.dtype)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan(tensors)
        single, wide, widen = plan
        if single:
            if widen:  # e.g. float16 grads: norms in float32 (a float16 norm overflows)
                return list(torch._foreach_norm(tensors, ord, dtype=wide)), None
            return list(torch._foreach_norm(tensors, ord)), None
        grouped = torch.utils._foreach_utils._group_tensors_by_device_and_dtype(
            [cast(list[torch.Tensor | None], tensors)], with_indices=True
        )
        norms: list[torch.Tensor] = []
        order: list[int] = []
        for [group], indices in grouped.values():
            present = cast(list[torch.Tensor], group)  # (every tensor given is one)
            group_norms = list(torch._foreach_norm(present, ord, dtype=wide))
            if present[0].device != first.device:
                group_norms = [n.to(first.device, non_blocking=True) for n in group_norms]
            norms.extend(group_norms)
            order.extend(indices)
        return norms, tuple(order)


def _plan(tensors: list[torch.Tensor]) -> tuple[bool, torch.dtype, bool]:
    """(one device and dtype?, the norms' dtype, must the norms be cast to it?)"""
    first = tensors[0]
    wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    single = all(t.device == first.device and t.dtype == first.dtype for t in tensors)
    return single, wide, first.dtype != wide


def compose_order(
    present: tuple[int, ...] | None, order: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """Parameter indices of the norm values, given which were present and how grouped."""
    if order is None:
        return present
    if present is None:
        return order
    return tuple(present[i] for i in order)


def _clip_counts(clip: ClipFields) -> tuple[int, int]:
    """A clipped step's ``clip_steps`` and ``clip_active_steps`` (summed over a thinned
    record's span): it clipped, and whether the unclipped total was above max_norm
    (the clip changed the gradients)."""
    total = clip["total_before"]
    active = total is not None and not total <= clip["max_norm"]  # (NaN: above)
    return 1, int(active)
