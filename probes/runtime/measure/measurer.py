"""What one training step measures, on the training thread, without reading a value.

(The step boundary itself, ``begin_step`` / ``end_step``, is in ``probes.runtime.steps.step``,
the optimizer's hooks in ``probes.runtime.optimizers.optimizer_hooks``; this module measures what
happens between them.)

``StepMeasurer`` is driven by the probe at the step's boundaries and the optimizer's
hooks. Every quantity is a 0-d tensor launched on the device; ``finish`` gathers them
into a ``Measurement`` whose copy to the host the sender reads later.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable
from itertools import repeat
from typing import Protocol, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.runtime.anomaly.guard import GuardTrip, find_non_finite
from probes.runtime.measure.host_copy import HostRing, to_host
from probes.runtime.measure.layers import LayerMap
from probes.runtime.measure.local_grads import LocalGradients
from probes.runtime.measure.sampled import ActivationStats, UpdateNorms
from probes.runtime.measure.stats import (
    ACTIVATIONS,
    CLIP_TOTAL,
    GRAD_MAX,
    GRADS,
    INPUT_RMS,
    LOCAL_GRAD_NORM,
    PARAMS,
    UPDATES,
    Measurement,
    NormReducer,
    compose_order,
)
from probes.runtime.measure.undivided import UndividedWatch
from probes.runtime.optimizers.clearing import ClearingWatch

_GRAD = operator.attrgetter("grad")
_STATE_KEYS = 12  # names at most (what a run sends is bounded)


def state_keys(optimizer: object) -> list[str]:
    """The names an optimizer keeps per parameter (``exp_avg_sq``, ``momentum_buffer``,
    LBFGS's ``old_dirs`` ...): its first parameter with state's, sorted. Host dicts."""
    state = getattr(optimizer, "state", None)
    if not isinstance(state, dict):
        return []
    for values in state.values():
        if isinstance(values, dict) and values:
            return sorted(str(key)[:40] for key in values)[:_STATE_KEYS]
    return []


class HookClock(Protocol):
    """A holder of hooks of ours that counts the seconds they spend."""

    spent: float


class StepMeasurer:
    """Launch a step's measurements; hand them over as a ``Measurement``.

    Args:
        model: the watched model.
        layers: its layers and trainable parameters.
        optimizer: its optimizer, if any (learning rates, update norms).
        grad_accumulation: the user accumulates on purpose: skip the zero_grad check.
        sample_every: the probe's sampling period (the zero_grad check follows it).
        on_error: called with an exception raised inside a hook of ours.
        register_post_hook: registers the hook after ``optimizer.step()`` of a step that
            measures the update (the probe's ``OptimizerHooks``, which owns every hook
            on the optimizer); by default the optimizer's own method.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: LayerMap,
        optimizer: torch.optim.Optimizer | None,
        *,
        grad_accumulation: bool,
        on_error: Callable[[Exception], None],
        sample_every: int = 20,
        register_post_hook: Callable[[Callable[..., None]], RemovableHandle] | None = None,
        local_grads: bool = False,
    ) -> None:
        self.layers = layers
        self.on_error = on_error  # a hook of ours must never raise into training
        self.sample_every = sample_every
        self.optimizer = optimizer
        self._register_post_hook = register_post_hook or (
            optimizer.register_step_post_hook if optimizer is not None else None
        )
        self.norms = NormReducer()
        self._ring = HostRing()  # pinned buffers and events, reused (CUDA)
        self.activations = ActivationStats(model, layers.names, on_error=on_error)
        # a data-parallel job's rank: its own gradients, before the all-reduce
        self.local = LocalGradients(layers.params, on_error) if local_grads else None
        # Without an optimizer the update is inside the step: its ratios are taken
        # across the step, from its beginning to its end.
        self.updates = UpdateNorms(layers.params, self.norms) if layers.params else None
        self.check_clearing = not grad_accumulation and bool(layers.params)
        # Tensor learning rates (capturable schedulers) travel with the batched copy.
        self._tensor_lrs = optimizer is not None and any(
            isinstance(g.get("lr"), torch.Tensor) for g in optimizer.param_groups
        )
        firsts: dict[int, int] = {}  # layer -> its first parameter
        for index, layer in enumerate(layers.param_layer):
            firsts.setdefault(layer, index)
        layer_params = [layers.params[firsts[layer]] for layer in range(len(layers.names))]
        # cleared between updates? passes per layer? (one tensor hook a backward pass)
        self.clearing = ClearingWatch(layer_params, on_error=on_error)
        # each update's backward passes: an accumulation of losses never divided?
        self.undivided = UndividedWatch(on_error=on_error)
        # What hooks of ours run inside the user's forward and backward (where the
        # step's boundary does not see them) spends: each one's ``spent`` seconds are
        # added to the step's probe time at its end.
        self.hook_clocks: list[HookClock] = [self.clearing]
        if self.local is not None:
            self.hook_clocks.append(self.local)
        self._post_hook: RemovableHandle | None = None
        # Update ratios are taken across the first optimizer.step() from a sampled step
        # on: under gradient accumulation the sampled step may have none of its own.
        self._update_pending = False
        self._measure_update = False
        self.current: Measurement | None = None
        self.index = -1  # the step under way, measured or not (the probe sets it)
        # Several optimizers: each one's parameters read at its own step (optimizers.py).
        self.merge_reads: Callable[[Measurement], None] | None = None
        self.merge_updates: Callable[[Measurement], None] | None = None

    # --- boundaries ------------------------------------------------------------------

    def begin(self, index: int, wall_time: float, sampled: bool) -> Measurement:
        """A measured step starts: fresh state; activation hooks on sampled steps."""
        self.current = Measurement(self.layers, index, wall_time, sampled)
        if self.optimizer is not None:
            self.current.optimizer_step = False  # until its pre-hook runs
        if sampled:  # (the model's input scale too, with or without activation modules)
            self.activations.attach()
            if self.local is not None:
                self.local.attach()
        self._measure_update = (sampled or self._update_pending) and self.updates is not None
        if self._measure_update and self.optimizer is None and self.updates is not None:
            self.updates.before_step()  # a hand-written update: across the whole step
        elif self._measure_update and self._register_post_hook is not None:
            # Only these steps need to see the weights after the update.
            self._post_hook = self._register_post_hook(self._after_optimizer_step)
        return self.current

    def abandon(self) -> None:
        """The step failed: drop its state and every hook it added."""
        self.activations.detach()
        if self.local is not None:
            self.local.detach()
        self._remove_post_hook()
        if self.updates is not None:
            self.updates.discard()
        self.current = None

    def _remove_post_hook(self) -> None:
        if self._post_hook is not None:
            self._post_hook.remove()
            self._post_hook = None

    def before_optimizer_step(self, *, guard: bool = False) -> GuardTrip | None:
        """Gradients are final: check they were cleared since the last step and note
        them for the next; launch their norms; on sampled steps copy the weights.

        With ``guard``, returns what it found when a gradient is non-finite (one host
        sync per step); the caller then keeps the optimizer from using them."""
        step = self.current
        if step is not None:
            step.optimizer_step = True
            step.lrs = self._learning_rates()  # the rates this update uses
        self._at_update(step)
        trip = self._guard(step) if guard else None
        if step is None:
            return trip
        if not step.grads_read:
            self.read_grads(step)
        if self._measure_update and self.updates is not None and trip is None:
            self.updates.before_step()
        return trip

    def _guard(self, step: Measurement | None) -> GuardTrip | None:
        """The guard's check, on a step measured or not (its grads read first)."""
        if step is None:
            step = Measurement(self.layers, self.index, 0.0, False)  # a step not measured
        if not step.grads_read:
            self.read_grads(step)
        return find_non_finite(step, self.layers)

    def _after_optimizer_step(self, optimizer: object, args: object, kwargs: object) -> None:
        """The weights moved (a sampled step): take the norms of the update."""
        step = self.current
        if step is not None and self.updates is not None:
            started = time.perf_counter()
            try:
                taken = self.updates.after_step()
                if taken is not None:
                    step.update_norms, step.update_order = taken
                    self._update_pending = False
                    keys = state_keys(optimizer)
                    if keys:  # what the optimizer keeps says what it is (the rules)
                        step.layer_values["optimizer_state"] = keys
                    if self.merge_updates is not None:
                        self.merge_updates(step)
            except Exception as exc:
                self.on_error(exc)
            step.probe_time += time.perf_counter() - started  # the probe's own time too

    def clipping(self, max_norm: float, norm_type: float = 2.0) -> None:
        """A clip is about to scale the gradients: read them first, unclipped."""
        step = self.current
        if step is not None:
            if not step.grads_read:
                self.read_grads(step)
            step.clipped = max_norm
            step.clip_norm_type = norm_type
        self.clearing.in_place_op()  # clipping scales every grad in place

    def clipped(self, total_norm: torch.Tensor) -> None:
        """The clip is done; ``total_norm`` is torch's norm before it (not read now)."""
        step = self.current
        if step is not None and isinstance(total_norm, torch.Tensor):
            step.tensor_scalars[CLIP_TOTAL] = total_norm.detach()

    def finish(self) -> Measurement | None:
        """The step ended: lay out what it launched and start the copy to the host."""
        step, self.current = self.current, None
        self._remove_post_hook()
        if self.optimizer is None:  # the step's own update: clearing checked at its end
            self._at_update(step)
            self.clearing.step_ended()
            if step is not None and self._measure_update and self.updates is not None:
                taken = self.updates.after_step()
                if taken is not None:
                    step.update_norms, step.update_order = taken
        if step is None:
            return None
        if not step.grads_read:
            self.read_grads(step)
        values: list[torch.Tensor] = list(step.grad_norms)
        layout = step.layout  # each section appended says so: the record reads by it
        layout.add(GRADS, len(values))
        step.grad_present = compose_order(step.grad_present, step.grad_order)
        if step.grad_max:
            layout.add(GRAD_MAX, len(step.grad_max))
            values += step.grad_max
            step.grad_max = []  # the values hold them now
        if step.update_norms:
            layout.add(UPDATES, len(step.update_norms))
            values += step.update_norms
        elif self._measure_update:
            # No optimizer.step() in this step: take the next one, until the next sampled
            # step (a loop that steps after the block never shows one inside it).
            self._update_pending = (step.step + 1) % self.sample_every != 0
        if step.sampled:
            param_norms, step.param_order = self._param_norms()
            layout.add(PARAMS, len(param_norms))
            values += param_norms
            counts, totals, hooked = self.activations.take()
            step.probe_time += hooked  # (the forward's hooks: the boundary did not see them)
            if self.activations.input_rms is not None:  # compared across a job's ranks
                step.tensor_scalars[INPUT_RMS] = self.activations.input_rms
            if counts:
                step.activation_totals = totals
                layout.add(ACTIVATIONS, len(counts))
                values += counts
        if not step.lrs:  # no optimizer.step() in this step: the rates now
            step.lrs = self._learning_rates()
        step.tensor_scalar_names = self._append_tensor_scalars(step, values)
        if values:
            step.values, step.event = to_host(values, self._ring)
            if step.event is not None:
                step.ring = self._ring
        step.grad_norms = []  # the values hold them now
        step.probe_time += self._hook_seconds()
        return step

    def _hook_seconds(self) -> float:
        """The seconds our hooks in forward and backward spent since the last call."""
        total = 0.0
        for clock in self.hook_clocks:
            total += clock.spent
            clock.spent = 0.0
        return total

    # --- pieces ------------------------------------------------------------------------

    def read_grads(self, step: Measurement) -> None:
        """Launch the batched per-parameter gradient norms (nothing is read yet)."""
        # One C-level pass over the parameters (a Python loop cost more than the norms
        # of a small model); the indices only when some gradient is missing.
        every = list(map(_GRAD, self.layers.params))
        step.grads_read = True
        if self.local is not None and step.sampled:
            local = self.local.take()
            if local is not None:
                step.tensor_scalars[LOCAL_GRAD_NORM] = local
        if all(map(operator.is_not, every, repeat(None))):
            grads = cast(list[torch.Tensor], every)
            step.none_grads = 0
            step.grad_present = None
        else:
            present = tuple(i for i, grad in enumerate(every) if grad is not None)
            grads = [every[i] for i in present]
            step.none_grads = len(every) - len(grads)
            step.grad_present = present
        if grads:
            step.grad_norms, step.grad_order = self._norms_of(grads)
            # Sampled steps: each gradient's largest |element| too (one kernel more). Not
            # with several optimizers: each reads its gradients at its own step, and only
            # the norms are kept across those reads (``optimizers.PerOptimizerReads``).
            if step.sampled and self.merge_reads is None:
                step.grad_max, order = self._norms_of(grads, math.inf)
                step.grad_max_order = compose_order(step.grad_present, order)
        if self.merge_reads is not None:
            self.merge_reads(step)

    def _norms_of(
        self, grads: list[torch.Tensor], order: float = 2.0
    ) -> tuple[list[torch.Tensor], tuple[int, ...] | None]:
        if grads[0].requires_grad:
            # Grads made by backward(create_graph=True): the norms must not grow a graph.
            with torch.no_grad():
                return self.norms.norms(grads, order)
        return self.norms.norms(grads, order)

    def _param_norms(self) -> tuple[list[torch.Tensor], tuple[int, ...] | None]:
        if not self.layers.params:
            return [], None
        with torch.no_grad():
            return self.norms.norms([p.detach() for p in self.layers.params])

    def _at_update(self, step: Measurement | None) -> None:
        """An update uses the gradients: were they cleared since the last one, and how
        many backward passes went into each layer's (``probes.runtime.optimizers.clearing``)?"""
        uncleared = self.clearing.take_uncleared()
        passes = self.clearing.count_passes()
        undivided = self.undivided.take(max((p for p in passes if p is not None), default=0))
        if step is not None:
            if self.check_clearing:  # (off: several optimizers check their own)
                step.not_cleared = uncleared
            step.layer_values["backward_passes"] = passes
            if self.clearing.discarded or self.clearing.in_game:
                step.layer_values["discarded_grads"] = True  # (a game: a GAN's players)
            if undivided:
                step.layer_values["undivided_passes"] = undivided
            if self.undivided.reduction is not None and step.step < 50:
                step.layer_values["loss_reduction"] = self.undivided.reduction

    def _append_tensor_scalars(
        self, step: Measurement, values: list[torch.Tensor]
    ) -> tuple[str, ...]:
        """Append the logged tensor scalars (and tensor LRs) to ``values``; their names.

        On the CPU there is no device to wait for: they are read now (cheaper than a
        copy, and a snapshot, since a scheduler may change a tensor LR in place)."""
        scalars = step.tensor_scalars
        if self.optimizer is not None and self._tensor_lrs:
            scalars = dict(scalars)
            for i, group in enumerate(self.optimizer.param_groups):
                if isinstance(group.get("lr"), torch.Tensor):
                    scalars[f"lr/{i}"] = group["lr"].detach()
        if not scalars:
            return ()
        like = values[0] if values else next(iter(scalars.values()))
        if like.device.type == "cpu":
            for name, tensor in scalars.items():
                if name.startswith("lr/"):
                    step.lrs[int(name[3:])] = tensor.item()
                elif name == CLIP_TOTAL:
                    step.clip_total = tensor.item()
                elif name == INPUT_RMS:
                    step.input_rms = tensor.item()
                elif name == LOCAL_GRAD_NORM:
                    step.local_grad_norm = tensor.item()
                else:
                    step.float_scalars[name] = tensor.item()
            return ()
        # The norms' float dtype; counts (activation hits) are integers, scalars are not.
        dtype = like.dtype if values and like.is_floating_point() else torch.float32
        for tensor in scalars.values():
            if tensor.dtype != dtype or tensor.device != like.device or tensor.dim():
                tensor = tensor.reshape(()).to(device=like.device, dtype=dtype, non_blocking=True)
            values.append(tensor)
        return tuple(scalars)

    def _learning_rates(self) -> list[float]:
        if self.optimizer is None:
            return []
        groups = self.optimizer.param_groups
        if not self._tensor_lrs:
            return [float(g.get("lr", math.nan)) for g in groups]
        # Tensor LRs travel with the batched copy (see _append_tensor_scalars).
        return [
            math.nan if isinstance(g.get("lr"), torch.Tensor) else float(g.get("lr", math.nan))
            for g in groups
        ]
