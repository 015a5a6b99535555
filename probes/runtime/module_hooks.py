"""Hooks traintop puts on a user's modules, invisible to what copies or saves them.

A forward hook lives in the module's own ``_forward_hooks`` (or ``_forward_pre_hooks``)
dictionary, so ``pickle``, ``torch.save(model)``, ``copy.deepcopy(model)`` (an EMA copy)
and a spawned DataLoader worker take it along: a closure or a method of the probe would
fail to pickle, or drag the probe (its threads and sockets) into the copy, and a file
saved so would need traintop to load. So every module hook traintop adds goes through
``add_hook``, which notes it, and while any is on a module, ``nn.Module.__getstate__``
(``probes.runtime.seams.MODULE_GETSTATE``) leaves the noted hooks out of the state it
returns: a watched model pickles, saves and deep-copies to exactly what it would
unwatched, and the copy carries no hook of traintop's. A module whose class writes its
own ``__getstate__`` without calling ``nn.Module``'s keeps them (as it would any hook).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.runtime.patches import REGISTRY, Layer
from probes.runtime.seams import MODULE_GETSTATE

_lock = threading.Lock()
#: id of a module's hook dictionary -> the keys (handle ids) of traintop's hooks in it
_ours: dict[int, set[int]] = {}
_layer: Layer | None = None


class ModuleHookHandle:
    """Removes a hook ``add_hook`` added (idempotent)."""

    def __init__(self, handle: RemovableHandle, hooks: dict[Any, Any]) -> None:
        self._handle: RemovableHandle | None = handle
        self._hooks_id = id(hooks)

    def remove(self) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        handle.remove()
        _forget(self._hooks_id, handle.id)


def add_hook(
    module: nn.Module, register: Callable[..., RemovableHandle], hook: Callable[..., Any]
) -> ModuleHookHandle:
    """``register(hook)`` (a bound ``module.register_forward_hook`` or
    ``register_forward_pre_hook``), with the hook left out of the module's state."""
    handle = register(hook)
    hooks = handle.hooks_dict_ref()
    if hooks is None:  # (torch keeps the dictionary alive while the module lives)
        return ModuleHookHandle(handle, {})
    global _layer
    with _lock:
        _ours.setdefault(id(hooks), set()).add(handle.id)
        if _layer is None:
            _layer = REGISTRY.add(MODULE_GETSTATE, Layer("module hooks", _state_without_ours))
    return ModuleHookHandle(handle, hooks)


def _forget(hooks_id: int, key: int) -> None:
    global _layer
    with _lock:
        keys = _ours.get(hooks_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del _ours[hooks_id]
        if not _ours and _layer is not None:
            REGISTRY.remove(MODULE_GETSTATE, _layer)
            _layer = None


def _state_without_ours(proceed: Callable[..., dict[str, Any]], module: nn.Module) -> Any:
    state = proceed(module)
    if not isinstance(state, dict):
        return state
    for name, value in list(state.items()):
        keys = _ours.get(id(value)) if isinstance(value, dict) else None
        if keys:
            state[name] = type(value)((k, v) for k, v in value.items() if k not in keys)
    return state


def noted() -> int:
    """How many of traintop's module hooks are on modules now (for tests)."""
    with _lock:
        return sum(map(len, _ours.values()))
