"""The probe's one global forward pre-hook (where step 0 begins), without the warning
it would make ``torch.compile`` print.

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

from torch import nn
from torch.nn.modules import module as torch_module

COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class FirstForwardHook:
    """``register_module_forward_pre_hook(hook)``; ``remove()`` takes it away."""

    def __init__(self, hook: Callable[[nn.Module, Any], Any]) -> None:
        alone = not _any_global_hook()
        self._filter: object | None = None
        if alone:
            warnings.filterwarnings("ignore", message=COMPILE_WARNING, category=UserWarning)
            self._filter = warnings.filters[0]
        self._handle = torch_module.register_module_forward_pre_hook(hook)

    def remove(self) -> None:
        """Remove the hook and the filter (idempotent)."""
        self._handle.remove()
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
