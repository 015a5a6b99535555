"""Every process-global thing traintop may patch, declared once
(``probes.runtime.patches.patches``).

Each is a :class:`~probes.runtime.patches.patches.Seam` (an attribute stood in for) or a
:class:`~probes.runtime.patches.patches.HookSeam` (one of torch's global hooks). The parts that
use them add layers through ``REGISTRY``; nothing else in traintop assigns to a global.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional
import torch.nn.utils
import torch.nn.utils.clip_grad
from torch.amp.grad_scaler import GradScaler
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer
from torch.utils.data import dataloader as torch_dataloader

from probes.runtime.patches.patches import HookSeam, Seam

__all__ = ["HookSeam", "Seam"]  # (re-exported: the seams and their kinds, one import)


def _holder(owner: ModuleType) -> Callable[[], ModuleType]:
    return lambda: owner


BACKWARD = Seam("torch.autograd.backward", lambda: torch.autograd, "backward")

#: The clip, by its public names and torch's own module's (``clip_grad_norm_`` looks up
#: ``_clip_grads_with_norm_`` in its module when it runs: a clip imported by name before
#: any probe existed still goes through that one).
CLIP_GRAD_NORM = (
    Seam("torch.nn.utils.clip_grad_norm_", lambda: torch.nn.utils, "clip_grad_norm_"),
    Seam(
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        lambda: torch.nn.utils.clip_grad,
        "clip_grad_norm_",
    ),
)
#: ``clip_grads_with_norm_`` (torch 2.6 on): what accelerate calls after
#: ``get_total_norm``, and what ``clip_grad_norm_`` calls to scale the gradients.
CLIP_WITH_NORM: tuple[Seam, ...] = tuple(
    Seam(f"{owner.__name__}.{name}", _holder(owner), name)
    for owner, name in (
        (torch.nn.utils, "clip_grads_with_norm_"),
        (torch.nn.utils.clip_grad, "_clip_grads_with_norm_"),
    )
    if hasattr(owner, name)
)

SCALER_SCALE = Seam("torch.amp.GradScaler.scale", lambda: GradScaler, "scale")
SCALER_UPDATE = Seam("torch.amp.GradScaler.update", lambda: GradScaler, "update")
SCALER_STEP = Seam("torch.amp.GradScaler.step", lambda: GradScaler, "step")

#: ``torch.compile``: a wrapper made of a watched model after ``watch()`` takes the hooks
#: at the model's entry (``probes.runtime.patches.hooks``), out of what it compiles.
TORCH_COMPILE = Seam("torch.compile", lambda: torch, "compile")

SHOW_WARNING = Seam("warnings.showwarning", lambda: warnings, "showwarning")

#: A ``DataLoader``'s iterators' ``__next__`` (every kind, one process or workers: they
#: inherit it): the time a loop spends inside it is its wait for data
#: (``probes.runtime.measure.phases``).
LOADER_NEXT = Seam(
    "torch.utils.data.dataloader._BaseDataLoaderIter.__next__",
    lambda: torch_dataloader._BaseDataLoaderIter,
    "__next__",
)

OPTIMIZER_INIT = Seam("torch.optim.Optimizer.__init__", lambda: torch.optim.Optimizer, "__init__")

#: ``nn.Module.__reduce_ex__`` (``object``'s, inherited): what ``pickle``, ``torch.save``
#: and ``copy.deepcopy`` take of any module, whatever its class's ``__getstate__`` (the
#: LSTM's writes its own), without traintop's hooks (``probes.runtime.patches.module_hooks``).
MODULE_REDUCE = Seam("torch.nn.Module.__reduce_ex__", lambda: torch.nn.Module, "__reduce_ex__")

#: ``torch.jit.script``: it compiles a module's hooks too (traintop's are not TorchScript).
JIT_SCRIPT = Seam("torch.jit.script", lambda: torch.jit, "script")

MODULE_FORWARD_PRE_HOOK = HookSeam(
    "torch global module forward pre-hook", torch_module.register_module_forward_pre_hook
)
OPTIMIZER_STEP_PRE_HOOK = HookSeam(
    "torch global optimizer step pre-hook", torch_optimizer.register_optimizer_step_pre_hook
)
OPTIMIZER_STEP_POST_HOOK = HookSeam(
    "torch global optimizer step post-hook", torch_optimizer.register_optimizer_step_post_hook
)
PARAMETER_REGISTRATION_HOOK = HookSeam(
    "torch global parameter registration hook",
    torch_module.register_module_parameter_registration_hook,
)
MODULE_REGISTRATION_HOOK = HookSeam(
    "torch global module registration hook",
    torch_module.register_module_module_registration_hook,
)

_functional: dict[str, Seam] = {}
_trainers: dict[tuple[str, str], Seam] = {}


def functional(name: str) -> Seam | None:
    """``torch.nn.functional.<name>`` (None where this torch has no such function)."""
    if not hasattr(torch.nn.functional, name):
        return None
    seam = _functional.get(name)
    if seam is None:
        seam = _functional[name] = Seam(
            f"torch.nn.functional.{name}", lambda: torch.nn.functional, name
        )
    return seam


def trainer(module: ModuleType, method: str) -> Seam:
    """A framework Trainer's method (``module.Trainer.<method>``)."""
    key = (module.__name__, method)
    seam = _trainers.get(key)
    if seam is None:
        seam = _trainers[key] = Seam(
            f"{module.__name__}.Trainer.{method}", lambda: module.Trainer, method
        )
    return seam
