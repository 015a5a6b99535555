"""Which layers a model has, for per-layer statistics.

A layer is a module that owns trainable parameters directly; its name is the dotted
module path (``(root)`` for the model itself). A parameter shared by several modules
(tied weights: a GPT's ``transformer.wte.weight`` and ``lm_head.weight``) is counted
once, under its first owner in ``named_modules`` order (``transformer.wte``); the other
modules sharing it are that layer's ``tied`` names (``lm_head``), which the hello
carries and the monitor shows beside the layer's name. A module with no parameter of
its own left (``lm_head`` without a bias) has no row of its own.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat

from torch import nn
from torch.nn.parameter import is_lazy

ROOT_LAYER_NAME = "(root)"


@dataclass(frozen=True)
class LayerMap:
    """The trainable parameters of a model, grouped by the layer that owns them.

    Attributes:
        names: layer names, in the fixed order every per-layer array uses.
        params: trainable parameters, each once.
        param_names: the dotted name of each parameter (``layer.weight``).
        param_layer: for each parameter, the index of its layer in ``names``.
        param_counts: number of elements per layer.
        tied: per layer (by name), the other modules that share one of its
            parameters, in ``named_modules`` order (only layers with tied weights).
    """

    names: tuple[str, ...]
    params: tuple[nn.Parameter, ...]
    param_names: tuple[str, ...]
    param_layer: tuple[int, ...]
    param_counts: tuple[int, ...]
    tied: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.names)


def map_layers(model: nn.Module) -> LayerMap:
    """Group ``model``'s trainable parameters by the module that owns them directly."""
    seen: set[int] = set()
    names: list[str] = []
    params: list[nn.Parameter] = []
    param_names: list[str] = []
    param_layer: list[int] = []
    counts: list[int] = []
    owner: dict[int, int] = {}  # a kept parameter -> its layer's index
    tied: dict[int, list[str]] = {}  # a layer's index -> the other modules sharing it
    for module_name, module in _every_name(model):
        layer_index = -1
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                seen.add(id(param))
                kept = owner.get(id(param))
                if kept is not None and kept != layer_index:
                    others = tied.setdefault(kept, [])
                    alias = module_name or ROOT_LAYER_NAME
                    if alias != names[kept] and alias not in others:
                        others.append(alias)
                continue
            seen.add(id(param))
            owner[id(param)] = len(names) if layer_index < 0 else layer_index
            if layer_index < 0:
                layer_index = len(names)
                names.append(module_name or ROOT_LAYER_NAME)
                counts.append(0)
            params.append(param)
            param_names.append(f"{module_name}.{param_name}" if module_name else param_name)
            param_layer.append(layer_index)
            # A lazy module's parameter has no size until its first forward.
            counts[layer_index] += 0 if is_lazy(param) else param.numel()
    return LayerMap(
        names=tuple(names),
        params=tuple(params),
        param_names=tuple(param_names),
        param_layer=tuple(param_layer),
        param_counts=tuple(counts),
        tied={names[index]: tuple(others) for index, others in tied.items()},
    )


def _every_name(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``named_modules()`` in its order, and also every further name of a module
    registered twice (its weights are shared as a whole); a module that contains itself
    is not entered again."""
    path: set[int] = set()  # the modules being walked: a cycle stops here

    def walk(prefix: str, module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
        yield prefix, module
        path.add(id(module))
        for name, child in module._modules.items():
            if child is not None and id(child) not in path:
                yield from walk(f"{prefix}.{name}" if prefix else name, child)
        path.discard(id(module))

    return walk("", model)


def combine_layer_norms(
    param_norms: list[float], present: tuple[int, ...] | None, layer_map: LayerMap
) -> list[float | None]:
    """Per-layer L2 norms from per-parameter L2 norms: ``sqrt(sum of squares)``.

    Args:
        param_norms: norms of the parameters listed in ``present`` (all when None).
        present: indices into ``layer_map.params`` that ``param_norms`` covers.
        layer_map: the model's layers.

    Returns:
        One norm per layer; ``None`` for a layer none of whose parameters is present.
    """
    if present is None and len(param_norms) == len(layer_map.param_layer):
        combined = _combine_all(param_norms, layer_map.param_layer)
        if combined is not None:
            return combined
    squares = _by_layer([norm * norm for norm in param_norms], present, layer_map, operator.add)
    return [None if s is None else s**0.5 for s in squares]


def combine_layer_peaks(
    param_peaks: list[float], present: tuple[int, ...] | None, layer_map: LayerMap
) -> list[float | None]:
    """Per-layer largest |element| from per-parameter ones (``combine_layer_norms``'
    arguments); a NaN in any parameter of a layer makes the layer's NaN."""
    return _by_layer(param_peaks, present, layer_map, _larger)


def _larger(a: float, b: float) -> float:
    """The larger of two, NaN if either is (``max`` keeps whichever comes first)."""
    return a if math.isnan(a) or (not math.isnan(b) and a >= b) else b


def _by_layer(
    values: list[float],
    present: tuple[int, ...] | None,
    layer_map: LayerMap,
    join: Callable[[float, float], float],
) -> list[float | None]:
    """Per-parameter ``values`` folded into one per layer with ``join``, in parameter
    order; None for a layer none of whose parameters is present."""
    folded: list[float | None] = [None] * layer_map.num_layers
    indices = range(len(values)) if present is None else present
    param_layer = layer_map.param_layer
    for value, param_index in zip(values, indices, strict=True):
        layer = param_layer[param_index]
        previous = folded[layer]
        folded[layer] = value if previous is None else join(previous, value)
    return folded


Runs = list[tuple[int, int, int]]
# A layout's runs of consecutive layers with as many parameters each: (first parameter,
# layers, parameters a layer), by the ``param_layer`` tuple it was made for (its id);
# None: a layout whose layers' parameters are not consecutive, in layer order.
_RUNS: dict[int, tuple[tuple[int, ...], Runs | None]] = {}


def _combine_all(
    param_norms: list[float], param_layer: tuple[int, ...]
) -> list[float | None] | None:
    """``combine_layer_norms`` of every parameter, in C-level passes: a layer's
    parameters are consecutive (``map_layers``), so a run of layers with k parameters
    each is k strided slices added, in the order (and to the bits) of the loop above.
    None for another layout (the loop then)."""
    known = _RUNS.get(id(param_layer))
    if known is None or known[0] is not param_layer:
        known = _RUNS[id(param_layer)] = (param_layer, _runs(param_layer))
    if known[1] is None:
        return None
    squares = list(map(operator.mul, param_norms, param_norms))
    sums: list[float] = []
    for start, layers, width in known[1]:
        end = start + layers * width
        run = squares[start:end:width]
        for offset in range(1, width):
            run = list(map(operator.add, run, squares[start + offset : end : width]))
        sums += run
    return list(map(pow, sums, repeat(0.5)))  # (s ** 0.5, as above)


def _runs(param_layer: tuple[int, ...]) -> Runs | None:
    if list(param_layer) != sorted(param_layer) or set(param_layer) != set(
        range(len(set(param_layer)))
    ):
        return None
    counts = Counter(param_layer)
    runs: Runs = []
    start = 0
    for layer in sorted(counts):
        width = counts[layer]
        if runs and runs[-1][2] == width:
            first, layers, _ = runs[-1]
            runs[-1] = (first, layers + 1, width)
        else:
            runs.append((start, 1, width))
        start += width
    return runs


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameter elements, shared ones counted once."""
    unique = {id(p): p for p in model.parameters() if p.requires_grad}
    return sum(p.numel() for p in unique.values() if not is_lazy(p))
