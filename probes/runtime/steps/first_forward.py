"""The probe's one global forward pre-hook (where step 0 begins), without the warning
it would make ``torch.compile`` print, and never inside a compiled region.

The hook is a layer on torch's global forward pre-hook (``probes.runtime.patches.seams``), so
``traintop run``'s and every probe's share one hook in torch and all of it goes when the
last is removed.

Inside a compiled region the hook returns at once: dynamo traces it as a constant, so
the graph is whole and computes what it would unwatched (a hook that ran there would
break the graph, and the split graph computes other floats). Step 0 of a model
compiled in place (``model.compile()``) therefore begins at its first backward or
``optimizer.step()``; a ``torch.compile(model)`` wrapper is called eagerly, so its
forward is seen there.

A compiled model (``torch.compile(model)``) warns on its calls while any global module
hook exists: such a hook fires once more, for the compiled wrapper. The probe's hook
reads only the module it watches and lives until the first forward, so the warning
would be about the probe, never the user's code: while the probe's hook is the only
global one, it is filtered out, and the filter goes with the hook. A global hook of the
user's own, there before it, keeps the warning.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from probes.runtime.patches.patches import REGISTRY, Layer
from probes.runtime.patches.seams import MODULE_FORWARD_PRE_HOOK

COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class FirstForwardHook:
    """``hook(module, args)`` before every eager module call; ``remove()`` ends it."""

    def __init__(self, hook: Callable[[nn.Module, Any], Any]) -> None:
        alone = not _any_global_hook()
        self._filter: object | None = None
        if alone:
            warnings.filterwarnings("ignore", message=COMPILE_WARNING, category=UserWarning)
            self._filter = warnings.filters[0]
        self._hook = hook
        self._layer: Layer | None = REGISTRY.add(
            MODULE_FORWARD_PRE_HOOK, Layer("first forward", self._outside_compiled)
        )

    def _outside_compiled(self, module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():  # a constant to dynamo: nothing traced
            return
        self._hook(module, args)

    def remove(self) -> None:
        """Remove the hook and the filter (idempotent)."""
        layer, self._layer = self._layer, None
        if layer is not None:
            REGISTRY.remove(MODULE_FORWARD_PRE_HOOK, layer)
        entry, self._filter = self._filter, None
        if entry is not None:
            with contextlib.suppress(ValueError):  # (a catch_warnings block restored them)
                cast(list[object], warnings.filters).remove(entry)
                mutated = getattr(warnings, "_filters_mutated", None)
                if mutated is not None:  # what filterwarnings calls: caches see the change
                    mutated()


def _any_global_hook() -> bool:
    check = getattr(torch_module, "_has_any_global_hook", None)
    return True if check is None else bool(check())  # unknown: leave the warning be
