"""What ``traintop run`` attaches to in an unmodified script (``bootstrap`` calls in).

- **Each optimizer** the script builds (``torch.optim.Optimizer.__init__``, patched) is
  watched with its model at the first forward after it is built (a global forward
  pre-hook, removed then; so a ``DDP(model)`` or ``torch.compile`` wrapper made in
  between is seen), or at its first ``step()`` if no forward comes first: one run per
  model (a GAN's two optimizers: two runs). Its steps are inferred
  (``probes.runtime.steps.autostep``).
- **An optimizer's own model** is the smallest module that owns every parameter it
  holds (and any wrapper holding just those parameters around it): modules are seen as
  they register parameters and submodules (torch's global registration hooks), not
  searched for. Parameters spread over several top-level modules are watched as one
  ``ModuleList`` of them. An optimizer whose model lies inside another's is watched in
  that run.
- **The watched model is the module the training forward runs** (``plan_runs``): the
  first module called with gradients on once the optimizer exists (the outermost of
  that forward). Where it holds more than its optimizers' own models, and among that
  trainable parameters no optimizer holds (``Adadelta(model.fc.parameters())`` with
  ``model(x)`` called), the first backward decides: some of them got a gradient (a
  backbone that learns and is never stepped), and the whole model is watched, so
  ``params_not_in_optimizer`` names them (step 0 begins at that backward); none did
  (run under ``torch.no_grad()``), and each optimizer's own model is. The rest of it
  frozen (``requires_grad=False``: linear probing), the head's own model is watched;
  held by several optimizers (an encoder and a head at other settings), it is one run
  of them all. A GAN's networks, forward-forward's layers and a backbone called apart
  under ``no_grad`` are separate modules: each optimizer keeps its own model.
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

from probes.runtime.patches import seams
from probes.runtime.patches.patches import Held, Layer

# By id, with a weak reference to tell a reused id: a tensor cannot be a weak key (its
# ``==`` compares elements).
_owners: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[nn.Module]]] = {}
_parent: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_pending: list[weakref.ref[torch.optim.Optimizer]] = []
# every optimizer the script built (what "no optimizer holds" is judged against)
_optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
# models a forward ran that hold more than their optimizers' own, waiting for the first
# backward: (the model, [(an optimizer's own model, its optimizers)])
_deferred: list[tuple[weakref.ref[nn.Module], list[tuple[weakref.ref[nn.Module], list[Any]]]]] = []
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
    if type(self).__module__.startswith("probes."):
        return
    _optimizers.add(self)
    if not _framework_depth:
        _note_pending(self)


@_safely
def _note_pending(optimizer: torch.optim.Optimizer) -> None:
    global _forward_hook
    _pending.append(weakref.ref(optimizer))
    if _forward_hook is None:
        from probes.runtime.steps.first_forward import FirstForwardHook

        _forward_hook = FirstForwardHook(_first_forward)


@_safely
def _first_forward(module: nn.Module, args: Any) -> None:
    """The first forward after an optimizer was built: watch it (its model is final)."""
    if not torch.is_grad_enabled():
        return  # an evaluation, or a look at the data: wait for a training forward
    _attach_pending(module)
    from probes.runtime.steps import autostep

    autostep.forward_begins(module, args)  # step 0 of what was just watched: this forward


@_safely
def _before_any_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if any(ref() is optimizer for ref in _pending):
        _attach_pending()
    if any(r() is optimizer for _, inside in _deferred for _, refs in inside for r in refs):
        _decide_deferred(None)  # no backward first (a closure's, autograd.grad's)


@_safely
def _attach_pending(called: nn.Module | None = None) -> None:
    """Watch the optimizers built so far; ``called`` is the module whose forward runs
    now (None at an ``optimizer.step()``), whose model they may be (``plan_runs``)."""
    global _forward_hook
    pending, _pending[:] = list(_pending), []
    if _forward_hook is not None:
        _forward_hook.remove()
        _forward_hook = None
    optimizers = [o for o in (ref() for ref in pending) if o is not None]
    runs, wider = plan_runs([o for o in optimizers if not _watched_elsewhere(o)], called)
    for model, held_by in runs:
        _watch(model, held_by)
    if wider is not None:  # its first backward decides (``_decide_deferred``)
        inside = [(weakref.ref(m), [weakref.ref(o) for o in held]) for m, held in wider[1]]
        _deferred.append((weakref.ref(wider[0]), inside))


Run = tuple[nn.Module, list[torch.optim.Optimizer]]


def plan_runs(
    optimizers: Sequence[torch.optim.Optimizer], called: nn.Module | None
) -> tuple[list[Run], tuple[nn.Module, list[Run]] | None]:
    """Which model each optimizer is watched with: the runs to make now, and a model
    whose first backward decides.

    An optimizer's own model is ``model_of`` its parameters; one lying inside another
    optimizer's model is watched in that run. When ``called`` (the module a training
    forward runs) holds more than the models inside it: with trainable parameters no
    optimizer holds, those runs wait for the first backward with it; with none, and
    several such models whose optimizers hold all it trains (an encoder and a head at
    other settings), it is one run of them all; else (the rest frozen: linear probing)
    each is watched as it is."""
    sets: dict[int, set[int]] = {}

    def ids(module: nn.Module) -> set[int]:
        if id(module) not in sets:
            sets[id(module)] = {id(p) for p in module.parameters()}
        return sets[id(module)]

    found = [(m, o) for o in optimizers if (m := model_of(_params_of(o))) is not None]
    runs: list[Run] = []
    for model, optimizer in sorted(found, key=lambda f: -len(ids(f[0]))):  # outer first
        outer = next((run for run in runs if ids(model) <= ids(run[0])), None)
        if outer is None:
            runs.append((model, [optimizer]))
        else:
            outer[1].append(optimizer)
    if called is None or any(ids(called) <= ids(model) for model, _ in runs):
        return runs, None  # (the run's own check names what its optimizers miss)
    inside = [run for run in runs if ids(run[0]) < ids(called)]
    rest = [run for run in runs if all(run is not r for r in inside)]
    if not inside:
        return runs, None
    if _unheld(called, _held_ids()):
        return rest, (called, inside)
    together = [o for _, held_by in inside for o in held_by]
    if len(inside) > 1 and not _unheld(called, {id(p) for o in together for p in _params_of(o)}):
        return [*rest, (called, together)], None  # its parts' optimizers: one run of it
    return runs, None


@_safely
def _decide_deferred(tensors: Any) -> None:
    """The first backward (or ``optimizer.step()``) since a forward of a model wider
    than its optimizers' own: watch the whole model if a parameter no optimizer holds
    got a gradient, else each optimizer's own part. A backward given is step 0's."""
    deferred, _deferred[:] = list(_deferred), []
    held = _held_ids()
    made = False
    for called_ref, inside in deferred:
        runs: list[Run] = []
        for model_ref, optimizer_refs in inside:
            model = model_ref()
            optimizers = [o for o in (r() for r in optimizer_refs) if o is not None]
            optimizers = [o for o in optimizers if not _watched_elsewhere(o)]
            if model is not None and optimizers:
                runs.append((model, optimizers))
        called = called_ref()
        if called is not None and any(p.grad is not None for p in _unheld(called, held)):
            runs = [(called, [o for _, optimizers in runs for o in optimizers])] if runs else []
        for model, optimizers in runs:
            made = _watch(model, optimizers) is not None or made
    if tensors is not None and made:
        from probes.runtime.steps import autostep

        autostep.adopt_backward(tensors)  # this backward is step 0's


def _params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _held_ids() -> set[int]:
    """The parameters some optimizer the script built holds."""
    return {id(p) for optimizer in list(_optimizers) for p in _params_of(optimizer)}


def _unheld(module: nn.Module, held: set[int]) -> list[nn.Parameter]:
    """``module``'s trainable parameters that no optimizer holds."""
    return [p for p in module.parameters() if p.requires_grad and id(p) not in held]


def _watched_elsewhere(optimizer: torch.optim.Optimizer) -> bool:
    from probes.runtime import lifecycle

    for probe in lifecycle.open_probes():
        held = getattr(probe, "optimizer", None)
        if held is optimizer or optimizer in getattr(held, "optimizers", ()):
            return True
    return False


def _watch(model: nn.Module, optimizers: list[torch.optim.Optimizer] | None) -> Any:
    global _watched_any
    import probes

    _watched_any = True
    held = optimizers[0] if optimizers and len(optimizers) == 1 else optimizers
    return probes.watch(model, held)


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
    if _deferred:  # a model wider than its optimizers: this backward decides
        _decide_deferred(args[0] if args else kwargs.get("tensors"))
    elif not _watched_any and not _pending and not _framework_depth:
        _hand_written(args[0] if args else kwargs.get("tensors"))
    return result


@_safely
def _hand_written(tensors: Any) -> None:
    from probes.runtime import lifecycle
    from probes.runtime.steps import autostep

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
    from probes.runtime.evaluation import functional
    from probes.runtime.optimizers import clip
    from probes.runtime.patches import module_hooks

    _process.hold(seams.PARAMETER_REGISTRATION_HOOK, Layer("traintop run", _parameter_registered))
    _process.hold(seams.MODULE_REGISTRATION_HOOK, Layer("traintop run", _module_registered))
    _process.hold(seams.OPTIMIZER_INIT, Layer("traintop run", _optimizer_init))
    _process.hold(seams.OPTIMIZER_STEP_PRE_HOOK, Layer("traintop run", _before_any_step))
    _process.hold(seams.BACKWARD, Layer("traintop run", _backward, order=40))
    clip.install()  # (held for the process: never uninstalled)
    functional.hold_losses()
    _process.hold(seams.JIT_SCRIPT, Layer("traintop run", module_hooks.script_untouched))


#: What ``traintop run`` holds for the whole process (never released: the process ends).
_process = Held()
