"""Hooks traintop puts on a user's modules, invisible to what copies or saves them.

A forward hook lives in the module's own ``_forward_hooks`` (or ``_forward_pre_hooks``)
dictionary, so ``pickle``, ``torch.save(model)``, ``copy.deepcopy(model)`` (an EMA copy)
and a spawned DataLoader worker take it along: a closure or a method of the probe would
fail to pickle, or drag the probe (its threads and sockets) into the copy, and a file
saved so would need traintop to load. So every module hook traintop adds goes through
``add_hook``, which notes it, and while any is on a module, ``nn.Module.__reduce_ex__``
(``probes.runtime.patches.seams.MODULE_REDUCE``: what pickle and deepcopy ask of an object)
leaves the noted hooks out of the state the module's class gives, whatever its
``__getstate__`` (``nn.LSTM`` writes its own): a watched model pickles, saves and
deep-copies to exactly what it would unwatched, and the copy carries no hook of
traintop's. A module whose class writes its own ``__reduce__`` or ``__reduce_ex__``
keeps them (as it would any hook).
``torch.jit.script`` (``probes.runtime.patches.seams.JIT_SCRIPT``), which compiles a module's
hooks with it, sees the module without them too: they are taken off for the call and
put back in their place.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from probes.runtime.patches.patches import REGISTRY, Layer, Seam
from probes.runtime.patches.seams import JIT_SCRIPT, MODULE_REDUCE

_lock = threading.Lock()
#: id of a module's hook dictionary -> the keys (handle ids) of traintop's hooks in it
_ours: dict[int, set[int]] = {}
_layers: list[tuple[Seam, Layer]] = []


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
    with _lock:
        _ours.setdefault(id(hooks), set()).add(handle.id)
        if not _layers:
            for seam, layer in _LAYERS:
                _layers.append((seam, REGISTRY.add(seam, layer)))
    return ModuleHookHandle(handle, hooks)


def _forget(hooks_id: int, key: int) -> None:
    with _lock:
        keys = _ours.get(hooks_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del _ours[hooks_id]
        if not _ours:
            while _layers:
                REGISTRY.remove(*_layers.pop())


def _reduced_without_ours(proceed: Callable[..., Any], module: nn.Module, protocol: int = 2) -> Any:
    reduced = proceed(module, protocol)
    if not _ours or not isinstance(reduced, tuple) or len(reduced) < 3:
        return reduced
    state = reduced[2]
    if isinstance(state, tuple) and state and isinstance(state[0], dict):  # (dict, slots)
        state = (_without_our_hooks(state[0]), *state[1:])
    elif isinstance(state, dict):
        state = _without_our_hooks(state)
    else:
        return reduced
    return (*reduced[:2], state, *reduced[3:])


def _without_our_hooks(state: dict[str, Any]) -> dict[str, Any]:
    filtered = None
    for name, value in state.items():
        keys = _ours.get(id(value)) if isinstance(value, dict) else None
        if keys:
            if filtered is None:  # (a class's state may be the module's own __dict__)
                filtered = dict(state)
            filtered[name] = type(value)((k, v) for k, v in value.items() if k not in keys)
    return state if filtered is None else filtered


def script_untouched(proceed: Callable[..., Any], obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.jit.script``'s layer: it compiles what it reaches from its source, hooks
    and the functions it calls included; traintop's hooks and stand-ins are not
    TorchScript, so it sees torch's own functions and the modules without our hooks."""
    hidden = _without_ours(obj) if isinstance(obj, nn.Module) else contextlib.nullcontext()
    with REGISTRY.suspended(), hidden:
        return proceed(obj, *args, **kwargs)


@contextlib.contextmanager
def _without_ours(model: nn.Module) -> Iterator[None]:
    """``model``'s modules without traintop's hooks for the block; after it, every hook
    dictionary holds what it held, in its order (the same objects: handles still work)."""
    taken: list[tuple[dict[Any, Any], list[tuple[Any, Any]]]] = []
    for module in model.modules():
        for value in vars(module).values():
            keys = _ours.get(id(value)) if isinstance(value, dict) else None
            if keys:
                taken.append((value, list(value.items())))
                for key in keys:
                    value.pop(key, None)
    try:
        yield
    finally:
        for hooks, items in taken:
            hooks.clear()
            hooks.update(items)


#: The seams held while any of traintop's hooks is on a module.
_LAYERS = (
    (MODULE_REDUCE, Layer("module hooks", _reduced_without_ours)),
    (JIT_SCRIPT, Layer("module hooks", script_untouched)),
)


def noted() -> int:
    """How many of traintop's module hooks are on modules now (for tests)."""
    with _lock:
        return sum(map(len, _ours.values()))
