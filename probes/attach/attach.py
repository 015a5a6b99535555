"""What ``traintop run`` attaches to in an unmodified script (``bootstrap`` calls in).

- **Each optimizer** the script builds (``torch.optim.Optimizer.__init__``, patched) is
  watched with its model, one run per optimizer (a GAN's two optimizers: two runs), at
  the first forward after it is built (a global forward pre-hook, removed then; so a
  ``DDP(model)`` or ``torch.compile`` wrapper made in between is seen), or at its first
  ``step()`` if no forward comes first. Its steps are inferred
  (``probes.runtime.autostep``).
- **The model** is the smallest module that owns every parameter the optimizer holds
  (and any wrapper holding just those parameters around it): modules are seen as they
  register parameters and submodules (torch's global registration hooks), not searched
  for. Parameters spread over several top-level modules are watched as one
  ``ModuleList`` of them.
- **A hand-written update** with no optimizer: the first backward that reaches
  parameters no probe watches and no optimizer holds watches their model, with no
  optimizer (steps end where the weights change, ``autostep``).
- **The Hugging Face and Lightning Trainers** get traintop's callback added to their
  own (``probes.hf``, ``probes.lightning``); the optimizers they build inside
  ``train()`` / ``fit()`` are theirs, not attached again. An optimizer an open probe
  already watches (a script that calls ``probes.watch``) is left to it.

Nothing here raises into the script: a failure is one ``traintop:`` line on stderr.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import weakref
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch
from torch import nn

from probes.runtime import seams
from probes.runtime.patches import Held, Layer

# By id, with a weak reference to tell a reused id: a tensor cannot be a weak key (its
# ``==`` compares elements).
_owners: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[nn.Module]]] = {}
_parent: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_pending: list[weakref.ref[torch.optim.Optimizer]] = []
_framework_depth = 0  # inside a Trainer's train()/fit(): its callback watches
_forward_hook: Any = None
_watched_any = False  # a probe was made here (the hand-written check stops then)
_installed = False


def _say(message: str) -> None:
    print(f"traintop: {message}", file=sys.stderr)


def _safely(function: Any) -> Any:
    @functools.wraps(function)
    def safe(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            _say(f"not attached: {type(exc).__name__}: {exc}")
            return None

    return safe


# --- what torch tells ---------------------------------------------------------------------


def _parameter_registered(module: nn.Module, name: str, param: Any) -> None:
    if isinstance(param, torch.Tensor) and _owner(param) is None:
        _owners[id(param)] = (weakref.ref(param), weakref.ref(module))
        if len(_owners) > 2 * _live_owners_at[0] + 1024:  # parameters come and go
            _forget_dead()


_live_owners_at = [0]


def _forget_dead() -> None:
    for key, (param, module) in list(_owners.items()):
        if param() is None or module() is None:
            del _owners[key]
    _live_owners_at[0] = len(_owners)


def _owner(param: torch.Tensor) -> nn.Module | None:
    """The module that registered ``param`` first."""
    held = _owners.get(id(param))
    if held is None or held[0]() is not param:
        return None
    return held[1]()


def _owned_with_grads() -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for param_ref, _ in list(_owners.values()):
        param = param_ref()
        if isinstance(param, nn.Parameter) and param.grad is not None:
            found.append(param)
    return found


def _module_registered(module: nn.Module, name: str, submodule: Any) -> None:
    if isinstance(submodule, nn.Module) and submodule is not module:
        _parent.setdefault(submodule, module)


def _optimizer_init(proceed: Any, self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
    proceed(self, *args, **kwargs)
    if type(self).__module__.startswith("probes.") or _framework_depth:
        return
    _note_pending(self)


@_safely
def _note_pending(optimizer: torch.optim.Optimizer) -> None:
    global _forward_hook
    _pending.append(weakref.ref(optimizer))
    if _forward_hook is None:
        from probes.runtime.first_forward import FirstForwardHook

        _forward_hook = FirstForwardHook(_first_forward)


@_safely
def _first_forward(module: nn.Module, args: Any) -> None:
    """The first forward after an optimizer was built: watch it (its model is final)."""
    if not torch.is_grad_enabled():
        return  # an evaluation, or a look at the data: wait for a training forward
    _attach_pending()
    from probes.runtime import autostep

    autostep.forward_begins(module, args)  # step 0 of what was just watched: this forward


@_safely
def _before_any_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if any(ref() is optimizer for ref in _pending):
        _attach_pending()


@_safely
def _attach_pending() -> None:
    global _forward_hook
    pending, _pending[:] = list(_pending), []
    if _forward_hook is not None:
        _forward_hook.remove()
        _forward_hook = None
    for ref in pending:
        optimizer = ref()
        if optimizer is not None and not _watched_elsewhere(optimizer):
            params = [p for g in optimizer.param_groups for p in g["params"]]
            model = model_of(params)
            if model is not None:
                _watch(model, optimizer)


def _watched_elsewhere(optimizer: torch.optim.Optimizer) -> bool:
    from probes.runtime import lifecycle

    for probe in lifecycle.open_probes():
        held = getattr(probe, "optimizer", None)
        if held is optimizer or optimizer in getattr(held, "optimizers", ()):
            return True
    return False


def _watch(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Any:
    global _watched_any
    import probes

    _watched_any = True
    return probes.watch(model, optimizer)


# --- the model of some parameters -----------------------------------------------------------


def model_of(params: Sequence[torch.Tensor]) -> nn.Module | None:
    """The smallest module owning every one of ``params``, with the wrappers around it
    that hold nothing more (DDP, ``torch.compile``); None if no module owns them."""
    wanted = {id(p) for p in params}
    if not wanted:
        return None
    first = next((m for m in map(_owner, params) if m is not None), None)
    module = first
    while module is not None:
        owned = {id(p) for p in module.parameters()}
        if wanted <= owned:
            while (outer := _parent.get(module)) is not None and owned == {
                id(p) for p in outer.parameters()
            }:
                module = outer
            return module
        module = _parent.get(module)
    roots: list[nn.Module] = []  # spread over several top-level modules
    for param in params:
        root = _owner(param)
        while root is not None and (outer := _parent.get(root)) is not None:
            root = outer
        if root is not None and all(r is not root for r in roots):
            roots.append(root)
    return nn.ModuleList(roots) if roots else None


# --- a hand-written update: the first backward no probe watches ------------------------------


def _backward(proceed: Any, *args: Any, **kwargs: Any) -> Any:
    result = proceed(*args, **kwargs)
    if not _watched_any and not _pending and not _framework_depth:
        _hand_written(args[0] if args else kwargs.get("tensors"))
    return result


@_safely
def _hand_written(tensors: Any) -> None:
    from probes.runtime import autostep, lifecycle

    if lifecycle.open_probes():
        return
    model = model_of(_owned_with_grads())
    if model is None:
        return
    _watch(model, None)
    autostep.adopt_backward(tensors)  # this backward is step 0's


# --- the frameworks ------------------------------------------------------------------------


def _with_callback(make_callback: Any, seam: seams.Seam) -> Any:
    """``Trainer.__init__``'s layer: traintop's callback joins the Trainer's own, however
    they were passed (by keyword, by position, or not at all)."""

    def __init__(proceed: Any, self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init = seam.original  # the Trainer's own: its parameters name the arguments
            args, kwargs = _add_callback(init, self, args, kwargs, make_callback())
        except Exception as exc:
            _say(f"no callback added: {type(exc).__name__}: {exc}")
        proceed(self, *args, **kwargs)

    return __init__


def _add_callback(
    init: Any, trainer: Any, args: tuple[Any, ...], kwargs: dict[str, Any], callback: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    bound = inspect.signature(init).bind_partial(trainer, *args, **kwargs)
    given = bound.arguments.get("callbacks")  # (Lightning takes one bare callback too)
    callbacks = [] if given is None else list(given) if isinstance(given, list | tuple) else [given]
    if any(type(c) is type(callback) for c in callbacks):
        return args, kwargs
    bound.arguments["callbacks"] = [*callbacks, callback]
    return bound.args[1:], bound.kwargs


def _framework_owned(proceed: Any, *args: Any, **kwargs: Any) -> Any:
    """``train()`` / ``fit()``: the optimizers built inside are the callback's to watch."""
    global _framework_depth
    _framework_depth += 1
    try:
        return proceed(*args, **kwargs)
    finally:
        _framework_depth -= 1


def _adopt_trainer(module: ModuleType, glue: str, run: str) -> None:
    """``module.Trainer`` gets the ``TraintopCallback`` of module ``glue`` (imported when a
    Trainer is made), and its method ``run`` owns the optimizers built inside it."""

    def callback() -> Any:
        return importlib.import_module(glue).TraintopCallback()

    init = seams.trainer(module, "__init__")
    _process.hold(init, Layer("traintop run", _with_callback(callback, init)))
    _process.hold(seams.trainer(module, run), Layer("traintop run", _framework_owned))


def hf_imported(module: ModuleType) -> None:
    """``transformers.trainer`` was imported: its Trainer gets traintop's callback."""
    _adopt_trainer(module, "probes.hf", "train")


def lightning_imported(module: ModuleType) -> None:
    """Lightning's trainer module was imported: its Trainer gets traintop's callback."""
    _adopt_trainer(module, "probes.lightning", "fit")


def torch_imported(module: ModuleType) -> None:
    """torch was imported: see modules, optimizers and backwards from now on. The clip
    and the loss functions get their stand-ins now, before the script can import them
    by name (``from torch.nn.utils import clip_grad_norm_``)."""
    global _installed
    if _installed:
        return
    _installed = True
    from probes.runtime import autoeval, clip, module_hooks

    _process.hold(seams.PARAMETER_REGISTRATION_HOOK, Layer("traintop run", _parameter_registered))
    _process.hold(seams.MODULE_REGISTRATION_HOOK, Layer("traintop run", _module_registered))
    _process.hold(seams.OPTIMIZER_INIT, Layer("traintop run", _optimizer_init))
    _process.hold(seams.OPTIMIZER_STEP_PRE_HOOK, Layer("traintop run", _before_any_step))
    _process.hold(seams.BACKWARD, Layer("traintop run", _backward, order=40))
    clip.install()  # (held for the process: never uninstalled)
    autoeval.hold_losses()
    _process.hold(seams.JIT_SCRIPT, Layer("traintop run", module_hooks.script_untouched))


#: What ``traintop run`` holds for the whole process (never released: the process ends).
_process = Held()
