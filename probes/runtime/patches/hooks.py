"""Hooks that stay out of ``torch.compile``'s graphs, and names free of wrapper prefixes.

A forward hook on a module inside a compiled forward is traced by dynamo like the rest
of the code: a hook of the probe there would either break the graph (falling back to
eager for the rest of the frame: slower, and other kernels, so other bits and other
dropout masks) or be traced once and replay stale state. Dynamo also guards on how many
hooks each inlined module has: adding one for a sampled step recompiles the model. So:

- the probe never hooks a module it knows runs inside a compiled region
  (``compiled_modules``: the inside of a ``torch.compile`` wrapper, a module compiled in
  place with ``module.compile()`` and what it holds, what a compiled ``forward`` calls);
  what it measures of the whole model it takes where the compiled model is entered
  (``entry_pre_hook``: the wrapper's own hooks, or before a module's compiled call),
  which dynamo never traces;
- every hook of the probe steps aside when traced anyway (``eager``: a compiled region
  the probe cannot see, such as a compiled training step): nothing is traced, no graph
  breaks, and the hook measures nothing there.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from probes.runtime.patches.module_hooks import ModuleHookHandle, add_hook
from probes.runtime.patches.patches import REGISTRY, Layer
from probes.runtime.patches.seams import TORCH_COMPILE

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
    """``hook``, run by Python where its module runs eagerly, and nothing where dynamo
    traces it: inside a compiled region it returns at once (``is_compiling`` is a
    constant to dynamo), so no graph breaks and nothing of it is traced. Unwrapped while
    nothing can be compiled (no cost at all in a run that never compiles)."""
    if not compiling_possible():
        return hook

    @functools.wraps(hook)
    def outside_compiled(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return None
        return hook(*args, **kwargs)

    return outside_compiled  # type: ignore[return-value]


def compiled_modules(model: nn.Module) -> set[int]:
    """The ids of ``model``'s modules whose hooks would run inside a compiled region.

    Inside: everything a ``torch.compile`` wrapper holds (``model`` itself when it was
    unwrapped from one), a module compiled in place (``module.compile()``) and what it
    holds, and what a module's compiled ``forward`` calls (not the module itself: its
    hooks run before that ``forward``). A module reached both ways counts as inside."""
    inside: set[int] = set()
    seen: set[tuple[int, bool]] = set()
    stack = [(model, compile_wrapper_of(model) is not None)]
    while stack:
        module, compiled = stack.pop()
        if (id(module), compiled) in seen:
            continue
        seen.add((id(module), compiled))
        in_place = getattr(module, "_compiled_call_impl", None) is not None
        if compiled or in_place:
            inside.add(id(module))
        holds_compiled = (
            compiled
            or in_place
            or type(module).__name__ == "OptimizedModule"
            or hasattr(module.__dict__.get("forward"), "_torchdynamo_orig_callable")
        )
        stack += [(c, holds_compiled) for c in module._modules.values() if c is not None]
    return inside


class EntryHandle:
    """Removes a hook ``entry_pre_hook`` added (idempotent)."""

    def __init__(self, remove: Callable[[], None]) -> None:
        self._remove: Callable[[], None] | None = remove

    def remove(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None


PreHook = Callable[[nn.Module, tuple[Any, ...]], None]


def entry_pre_hook(module: nn.Module, hook: PreHook) -> EntryHandle:
    """Call ``hook(module, args)`` before every call of ``module``, outside any compiled
    graph: on the ``torch.compile`` wrapper ``module`` was unwrapped from, before the
    compiled call of a module compiled in place, or as a plain forward pre-hook."""
    wrapper = compile_wrapper_of(module)
    if wrapper is not None:
        handle = add_hook(
            wrapper, wrapper.register_forward_pre_hook, lambda _, args: hook(module, args)
        )
        return EntryHandle(handle.remove)
    if getattr(module, "_compiled_call_impl", None) is not None:
        entry = _ENTRIES.get(module)
        if entry is None or module._compiled_call_impl is not entry:
            entry = _ENTRIES[module] = _CompiledEntry(module)
        return entry.add(hook)
    plain = _PlainEntry(module, hook)
    _PLAIN.setdefault(module, []).append(plain)
    return EntryHandle(plain.remove)


class _PlainEntry:
    """An entry hook on a module not compiled (yet): a plain pre-hook, moved to the
    ``torch.compile`` wrapper if one is made of the module later (``compiled``)."""

    def __init__(self, module: nn.Module, hook: PreHook) -> None:
        self._module = weakref.ref(module)
        self._hook = hook
        self._handle: ModuleHookHandle | None = add_hook(
            module, module.register_forward_pre_hook, hook
        )

    def move_to(self, wrapper: nn.Module) -> None:
        module = self._module()
        if self._handle is None or module is None:
            return
        self._handle.remove()
        hook = self._hook
        self._handle = add_hook(
            wrapper, wrapper.register_forward_pre_hook, lambda _, args: hook(module, args)
        )

    def remove(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()
        module = self._module()
        entries = _PLAIN.get(module) if module is not None else None
        if entries is not None and self in entries:
            entries.remove(self)


def _compiled(proceed: Callable[..., Any], model: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``torch.compile``'s layer: a wrapper made of a module that has entry hooks takes
    them (before its first call: nothing of the probe's is inside what it compiles)."""
    compiled = proceed(model, *args, **kwargs)
    if isinstance(model, nn.Module) and type(compiled).__name__ == "OptimizedModule":
        _COMPILE_WRAPPERS[model] = weakref.ref(compiled)
        for entry in list(_PLAIN.get(model, ())):
            entry.move_to(compiled)
    return compiled


_COMPILE_LAYER = Layer("compiled models' entries", _compiled)


def see_compiles() -> None:
    """``torch.compile`` tells the entries of the models it wraps (one call per open
    probe; the registry counts them, and ``unsee_compiles`` undoes one)."""
    REGISTRY.add(TORCH_COMPILE, _COMPILE_LAYER)


def unsee_compiles() -> None:
    """Undo one ``see_compiles``; the last puts ``torch.compile`` back."""
    REGISTRY.remove(TORCH_COMPILE, _COMPILE_LAYER)


class _CompiledEntry:
    """Stands in for the compiled call of a module compiled in place while the probe
    has hooks on its entry: runs them, then the compiled call (put back with the last)."""

    def __init__(self, module: nn.Module) -> None:
        self._module = weakref.ref(module)
        self._compiled: Callable[..., Any] = module._compiled_call_impl  # type: ignore[assignment]
        self._hooks: dict[int, PreHook] = {}
        self._next = 0
        module._compiled_call_impl = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self._module()
        if module is not None:
            for hook in tuple(self._hooks.values()):
                hook(module, args)
        return self._compiled(*args, **kwargs)

    def add(self, hook: PreHook) -> EntryHandle:
        key, self._next = self._next, self._next + 1
        self._hooks[key] = hook
        return EntryHandle(lambda: self._drop(key))

    def _drop(self, key: int) -> None:
        self._hooks.pop(key, None)
        module = self._module()
        if not self._hooks and module is not None and module._compiled_call_impl is self:
            module._compiled_call_impl = self._compiled
            _ENTRIES.pop(module, None)


# The torch.compile wrapper each module was unwrapped from (``unwrap``; a weak value:
# the wrapper holds the module), and the stand-ins of compiled calls carrying entry hooks.
_COMPILE_WRAPPERS: weakref.WeakKeyDictionary[nn.Module, weakref.ref[nn.Module]] = (
    weakref.WeakKeyDictionary()
)
_ENTRIES: weakref.WeakKeyDictionary[nn.Module, _CompiledEntry] = weakref.WeakKeyDictionary()
_PLAIN: weakref.WeakKeyDictionary[nn.Module, list[_PlainEntry]] = weakref.WeakKeyDictionary()


def compile_wrapper_of(module: nn.Module) -> nn.Module | None:
    """The live ``torch.compile`` wrapper ``module`` was unwrapped from, if any."""
    wrapper = _COMPILE_WRAPPERS.get(module)
    return None if wrapper is None else wrapper()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's own module inside compile and data-parallel wrappers.

    Layer names are taken from it, so they read ``encoder.0`` rather than
    ``_orig_mod.module.encoder.0``; the modules (and hooks) are the same objects."""
    while True:
        attribute = _WRAPPED.get(type(model).__name__)
        inner = getattr(model, attribute, None) if attribute else None
        if not isinstance(inner, nn.Module):
            return model
        if attribute == "_orig_mod":  # its calls are entered here (``entry_pre_hook``)
            _COMPILE_WRAPPERS[inner] = weakref.ref(model)
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
