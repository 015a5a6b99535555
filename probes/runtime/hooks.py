"""Hooks that stay correct under ``torch.compile``, and names free of wrapper prefixes.

A forward hook on a module inside a compiled forward is traced by dynamo like the rest
of the code: its Python side effects (a tally kept for this step only) run once, at
trace time, and a later graph replays stale state. So every hook of the probe runs
eagerly (``torch.compiler.disable``): on the steps that carry hooks the compiled
forward breaks around them; on the others nothing changes. The wrapper costs about
half a microsecond per call (against 0.06 for a plain call), and about 5 us to make,
so hooks are wrapped once and kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

Hook = TypeVar("Hook", bound=Callable[..., object])

# Attribute under which each wrapper keeps the module it wraps: torch.compile's
# OptimizedModule, DistributedDataParallel / DataParallel (and FSDP's wrapper).
_WRAPPED = {
    "OptimizedModule": "_orig_mod",
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
}


def compiling_possible() -> bool:
    """Whether anything can be compiled yet: torch.compile needs dynamo loaded (torch
    2.13 loads it with the first optimizer; a run without one may never)."""
    return "torch._dynamo" in sys.modules


def eager(hook: Hook) -> Hook:
    """``hook``, always run by Python, never traced into a compiled graph. Unwrapped
    while nothing can be compiled: the wrapper's first use would load dynamo (a second
    of stall in the middle of a run that never compiles)."""
    if not compiling_possible():
        return hook
    return torch.compiler.disable(hook)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's own module inside compile and data-parallel wrappers.

    Layer names are taken from it, so they read ``encoder.0`` rather than
    ``_orig_mod.module.encoder.0``; the modules (and hooks) are the same objects."""
    while True:
        attribute = _WRAPPED.get(type(model).__name__)
        inner = getattr(model, attribute, None) if attribute else None
        if not isinstance(inner, nn.Module):
            return model
        model = inner


# Attributes under which optimizer wrappers keep the optimizer they wrap: accelerate's
# AcceleratedOptimizer (and the HF Trainer's) ``optimizer``, Lightning's
# LightningOptimizer ``_optimizer``. AcceleratedOptimizer subclasses Optimizer without
# running its __init__: hooks must go on the optimizer inside.
_OPTIMIZER_ATTRIBUTES = ("optimizer", "_optimizer")


def unwrap_optimizer(optimizer: object) -> torch.optim.Optimizer | None:
    """The ``torch.optim.Optimizer`` inside ``optimizer`` (itself, or held by a wrapper).

    Raises:
        TypeError: ``optimizer`` is neither an optimizer nor a wrapper of one (a list
            of parameters given where the optimizer goes, say), with what was expected.
    """
    if optimizer is None:
        return None
    current = optimizer
    for _ in range(8):  # wrappers of wrappers, but never a cycle
        inner = next(
            (
                getattr(current, name)
                for name in _OPTIMIZER_ATTRIBUTES
                if isinstance(getattr(current, name, None), torch.optim.Optimizer)
            ),
            None,
        )
        if inner is None:
            break
        current = inner
    if isinstance(current, torch.optim.Optimizer) and hasattr(current, "_optimizer_step_pre_hooks"):
        return current
    raise TypeError(
        "watch() takes the optimizer as its second argument: a torch.optim.Optimizer, or "
        "a wrapper that holds one (accelerate's, Lightning's); got "
        f"{_describe(optimizer)}"
    )


def _describe(value: object) -> str:
    if isinstance(value, list | tuple):
        kinds = {type(item).__name__ for item in value}
        return f"a {type(value).__name__} of {', '.join(sorted(kinds)) or 'nothing'}"
    return f"a {type(value).__module__}.{type(value).__name__}"
