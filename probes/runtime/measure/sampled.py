"""Costlier statistics, taken on sampled steps only (every ``sample_every`` steps).

``ActivationStats`` attaches forward hooks to the activation modules for one step and
counts dead (exactly zero, ReLU family) or saturated (tanh, sigmoid) outputs on the
device, and the exact zeros of the inputs of linear and convolutional layers (a ReLU
written as a function). ``UpdateNorms`` copies the weights before ``optimizer.step()`` and takes the
norm of the change after it. Neither reads a value: the results join the step's
batched copy to the host, and every hook handle is removed when the step ends.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import torch
from torch import nn

from probes.kernel.schema import INPUT_SUFFIX
from probes.runtime.measure.stats import NormReducer
from probes.runtime.patches.hooks import (
    EntryHandle,
    compiled_modules,
    compiling_possible,
    eager,
    entry_pre_hook,
)
from probes.runtime.patches.module_hooks import ModuleHookHandle, add_hook

# Module type -> (family, test of an output element being dead or saturated).
RELU_TYPES: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)
TANH_TYPES: tuple[type[nn.Module], ...] = (nn.Tanh, nn.Hardtanh)
SIGMOID_TYPES: tuple[type[nn.Module], ...] = (nn.Sigmoid, nn.Hardsigmoid)
ACTIVATION_ROWS = 16  # batch rows an activation's dead/saturated fraction is counted on
TANH_SATURATED = 0.99  # |tanh(x)| above this: the gradient 1 - y^2 is below 0.02
SIGMOID_SATURATED = 0.01  # sigmoid below this or above 1 - this
# Layers whose input is counted for exact zeros (a ReLU written as F.relu before them).
INPUT_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.modules.conv._ConvNd)


def activation_family(module: nn.Module) -> str | None:
    """``"relu"``, ``"tanh"``, ``"sigmoid"`` or None for other modules."""
    if isinstance(module, RELU_TYPES):
        return "relu"
    if isinstance(module, TANH_TYPES):
        return "tanh"
    if isinstance(module, SIGMOID_TYPES):
        return "sigmoid"
    return None


def _inputs_known(model: nn.Module, layers: set[str]) -> set[str]:
    """Layers whose input needs no count of its own: in an ``nn.Sequential``, the
    model's first (its input is the data), one right after an activation module
    (counted already) and one right after another layer (no ReLU in between)."""
    known = set()
    for parent_name, parent in model.named_modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children = list(parent.named_children())
        names = [f"{parent_name}.{child}" if parent_name else child for child, _ in children]
        for i, name in enumerate(names):
            if (i == 0 and parent is model) or (
                i > 0
                and (activation_family(children[i - 1][1]) is not None or names[i - 1] in layers)
            ):
                known.add(name)
    return known


class ActivationStats:
    """Fraction of dead or saturated outputs per activation module, on sampled steps,
    counted on the first ``ACTIVATION_ROWS`` rows of the batch (enough to estimate a
    fraction; counting whole outputs of a wide model cost most of a sampled step).

    Activations written as functions (``F.relu`` inside a forward) have no module to
    hook: for them the input of each linear or convolutional layer is counted too (its
    exact zeros, family ``"input"``, named ``layer(input)``), unless that input is the
    model's own (the data).

    Modules that run inside a compiled region (``probes.runtime.patches.hooks``) are not
    counted: a hook there would break the graph or recompile it. The model's input is
    still seen where the compiled model is entered.
    """

    def __init__(
        self,
        model: nn.Module,
        layer_names: tuple[str, ...] = (),
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.on_error = on_error  # a failing count must not raise into the forward
        # (name, family, module, index of the layer feeding it: the last layer before
        # it in module order, so the monitor can colour that layer's row)
        self.modules: list[tuple[str, str, nn.Module, int | None]] = []
        layer_index = {name: i for i, name in enumerate(layer_names)}
        fed_by_sequential = _inputs_known(model, set(layer_index))
        compiled = compiled_modules(model)
        feeding: int | None = None
        for name, module in model.named_modules():
            key = name or "(root)"
            if id(module) in compiled:
                feeding = layer_index.get(key, feeding)
                continue
            if (
                key in layer_index
                and isinstance(module, INPUT_TYPES)
                and key not in fed_by_sequential
            ):
                self.modules.append((f"{key}{INPUT_SUFFIX}", "input", module, feeding))
            feeding = layer_index.get(key, feeding)
            family = activation_family(module)
            if family is not None:
                self.modules.append((key, family, module, feeding))
        self._model = model
        self._model_inputs: set[int] = set()  # ids of this step's inputs to the model
        # The RMS of the model's first floating input this step (a 0-d tensor, unread):
        # the scale of this rank's data, compared across a job's ranks.
        self.input_rms: torch.Tensor | None = None
        # which tensors are the model's inputs is noted only where layer inputs are counted
        self._count_model_inputs = any(family == "input" for _, family, _, _ in self.modules)
        self._handles: list[ModuleHookHandle | EntryHandle] = []
        # Per module this step: its hit count so far (None: it has not run) and the
        # elements counted; two lists, not an object per module (made on each sampled step).
        self._hits: list[torch.Tensor | None] = []
        self._totals: list[int] = []
        # Per module, how its hook is registered (a pre-hook for a layer's input).
        self._registers = [
            "register_forward_pre_hook" if family == "input" else "register_forward_hook"
            for _, family, _, _ in self.modules
        ]
        self._plain_hooks = [
            self._hook(i, family) for i, (_, family, _, _) in enumerate(self.modules)
        ]
        self._plain_inputs_hook = self._note_model_inputs
        # Seconds in these hooks (inside the user's forward, where the step's boundary
        # does not see them): the probe's own time too, taken by ``take``.
        self.spent = 0.0
        self._eager_hooks: list[Callable[..., None]] | None = None
        self._eager_inputs_hook: Callable[..., None] | None = None

    @property
    def names(self) -> list[list[object]]:
        """``[name, family, feeding layer index]`` per activation module (for the hello)."""
        return [[name, family, layer] for name, family, _, layer in self.modules]

    def attach(self) -> None:
        """Start counting (one step)."""
        self.detach()
        self.spent = 0.0
        count = len(self.modules)
        self._hits = [None] * count
        self._totals = [0] * count
        self._model_inputs.clear()
        hooks, inputs_hook = self._hooks_now()
        self.input_rms = None
        # One hook on the model: its input's scale, and (when layer inputs are counted)
        # which tensors are its inputs.
        handles = self._handles
        handles.append(entry_pre_hook(self._model, inputs_hook))
        for (_, _, module, _), register, hook in zip(
            self.modules, self._registers, hooks, strict=True
        ):
            handles.append(add_hook(module, getattr(module, register), hook))

    def _hooks_now(self) -> tuple[list[Callable[..., None]], Callable[..., None]]:
        """The hooks, made once: plain, or eager once anything can be compiled."""
        if self._eager_hooks is None and compiling_possible():
            self._eager_hooks = [eager(hook) for hook in self._plain_hooks]
            self._eager_inputs_hook = eager(self._plain_inputs_hook)
        if self._eager_hooks is not None and self._eager_inputs_hook is not None:
            return self._eager_hooks, self._eager_inputs_hook
        return self._plain_hooks, self._plain_inputs_hook

    def _note_model_inputs(self, module: nn.Module, args: object) -> None:
        """The model's own inputs are data, not activations: their zeros say nothing.
        Their scale is this rank's data's (``input_rms``)."""
        started = perf_counter()
        self._note_input_scale(module, args)
        if self._count_model_inputs and isinstance(args, tuple):
            self._model_inputs.update(id(a) for a in args if isinstance(a, torch.Tensor))
        self.spent += perf_counter() - started

    def _note_input_scale(self, module: nn.Module, args: object) -> None:
        """The RMS of the first floating input of the step's first forward, on a sample
        of ``INPUT_SAMPLE`` elements (launched, not read)."""
        if self.input_rms is not None or not isinstance(args, tuple):
            return
        try:
            first = next(
                (a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None
            )
            if first is not None and first.numel():  # (detached: no graph, no no_grad)
                sample = first.detach().reshape(-1)[:INPUT_SAMPLE].float()
                self.input_rms = sample.square().mean().sqrt()
        except Exception as exc:  # never into the user's forward
            if self.on_error is not None:
                self.on_error(exc)

    def detach(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def take(self) -> tuple[list[torch.Tensor], list[int], float]:
        """Detach; return the hit counts (0-d tensors) and element totals of the modules
        that ran, and the seconds spent in the hooks. Modules that did not run this step
        are left out (total 0)."""
        self.detach()
        hits, totals = self._hits, self._totals
        self._hits, self._totals = [], []
        spent, self.spent = self.spent, 0.0
        return [h for h in hits if h is not None], totals, spent

    def _hook(self, index: int, family: str) -> Callable[..., None]:
        def count(module: nn.Module, args: object, output: object) -> None:
            started = perf_counter()
            try:
                tally(module, output)
            except Exception as exc:  # never into the user's forward
                if self.on_error is not None:
                    self.on_error(exc)
            self.spent += perf_counter() - started

        def count_input(module: nn.Module, args: object) -> None:
            started = perf_counter()
            try:
                first = args[0] if isinstance(args, tuple) and args else None
                if (
                    isinstance(first, torch.Tensor)
                    and first.is_floating_point()
                    and id(first) not in self._model_inputs
                ):
                    tally(module, first)
            except Exception as exc:
                if self.on_error is not None:
                    self.on_error(exc)
            self.spent += perf_counter() - started

        def tally(module: nn.Module, output: object) -> None:
            if not isinstance(output, torch.Tensor) or index >= len(self._hits):
                return
            # detached: what is computed here grows no graph (cheaper than no_grad's
            # context manager, a few Python calls a hook)
            output = output.detach()
            if output.dim() > 1 and output.shape[0] > ACTIVATION_ROWS:
                output = output[:ACTIVATION_ROWS]  # a fraction: a few samples estimate it
            if not output.numel():
                return
            counted = activation_sample(output)
            # count_nonzero: half the cost of a comparison + sum
            if family in ("relu", "input"):
                hits = torch.rsub(torch.count_nonzero(counted), counted.numel())
            elif family == "tanh":
                hits = torch.count_nonzero(counted.abs() > TANH_SATURATED)
            else:
                saturated = (counted < SIGMOID_SATURATED) | (counted > 1 - SIGMOID_SATURATED)
                hits = torch.count_nonzero(saturated)
            # A non-finite output makes its fraction NaN: the first module (in forward
            # order) whose output is not finite is named on this very step. Its
            # smallest and largest tell (NaN propagates, an infinity is one of them) in
            # one pass with no mask: isfinite(x).all() cost 28x more. x - x is 0 for a
            # finite x (no overflow, float16 too), NaN otherwise.
            low, high = torch.aminmax(output)
            hits = hits.float() + (low - low + (high - high)).float()
            held = self._hits[index]
            self._hits[index] = hits if held is None else held + hits
            self._totals[index] += counted.numel()

        return count_input if family == "input" else count


INPUT_SAMPLE = 4096  # elements of the model's input its scale is taken on
ACTIVATION_SAMPLE = 16384  # elements an activation's dead/saturated fraction is counted on


def activation_sample(output: torch.Tensor) -> torch.Tensor:
    """About ``ACTIVATION_SAMPLE`` elements of ``output``: evenly spaced whole rows of
    its last dimension (a view, no copy), or all of it. The batch rows were cut before
    (``ACTIVATION_ROWS``), but a sequence model's rows hold every position: 8 x 128 x
    1,024 elements, whose count cost a sampled step of a small transformer 20 ms."""
    if output.numel() <= ACTIVATION_SAMPLE or output.dim() < 2 or not output.is_contiguous():
        return output
    width = output.shape[-1]
    rows = output.view(-1, width)
    keep = max(1, ACTIVATION_SAMPLE // width)
    return rows[:: max(1, rows.shape[0] // keep)]


UPDATE_SAMPLE = 4096  # elements per parameter the update/weight ratio is estimated on


class UpdateNorms:
    """|w_after - w_before| and |w_after| across one ``optimizer.step()``, on a sample
    of about ``UPDATE_SAMPLE`` elements of each parameter (evenly spaced rows).

    Copying every weight would cost more than the rest of the probe together (25 MB
    for a 6M-parameter model, each sampled step); a sample of each tensor estimates the
    ratio |dw|/|w| well (exactly for tensors of up to that many elements).
    """

    def __init__(
        self, params: tuple[nn.Parameter, ...], norms: NormReducer, sample: int = UPDATE_SAMPLE
    ) -> None:
        self.params = list(params)
        self._norms = norms
        self._sample = sample
        self._views: list[torch.Tensor] = []
        self._before: list[torch.Tensor] | None = None

    def before_step(self) -> None:
        """Copy the sampled weights (one batched op)."""
        with torch.no_grad():
            self._views = [self._view(p) for p in self.params]
            self._before = list(torch._foreach_mul(self._views, 1.0))

    def after_step(self) -> tuple[list[torch.Tensor], tuple[int, ...] | None] | None:
        """Norms of the sampled change, then of the sampled weights (0-d tensors, one
        list, 2 x parameters long) and their order; None without a copy."""
        before, self._before = self._before, None
        if before is None:
            return None
        with torch.no_grad():
            torch._foreach_sub_(before, self._views)  # before - after: the same norm
            return self._norms.norms([*before, *self._views])

    def discard(self) -> None:
        """Drop the copy (a step that failed)."""
        self._before = None

    def _view(self, param: torch.Tensor) -> torch.Tensor:
        """Evenly spaced whole rows (contiguous runs: a strided gather of single elements
        costs ten times more), about ``sample`` elements in all."""
        data = param.detach()
        rows = data.reshape(data.shape[0], -1) if data.dim() > 1 else data.reshape(1, -1)
        count, width = rows.shape
        if count * width <= self._sample:
            return rows
        keep = max(1, self._sample // width)
        return rows[:: max(1, count // keep)]
