"""The one registry of process-global patches (probes/runtime/patches/patches.py, seams.py).

Each seam is installed once, chained in a fixed order whatever order its layers came
in, and restored to the very object that was there before when its last layer goes;
after every probe closes, in any order, every global traintop patches is torch's own.
"""

from __future__ import annotations

import itertools
import types
import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

import probes
from probes.runtime.patches import seams
from probes.runtime.patches.patches import REGISTRY, HookSeam, Layer, PatchRegistry, Seam

#: Every attribute seam the runtime declares, with the object there before any probe
#: opened (this module is imported before any test opens one).
ATTRIBUTE_SEAMS: list[Seam] = [
    seams.BACKWARD,
    *seams.CLIP_GRAD_NORM,
    *seams.CLIP_WITH_NORM,
    seams.SCALER_SCALE,
    seams.SCALER_UPDATE,
    seams.SCALER_STEP,
    seams.SHOW_WARNING,
    seams.OPTIMIZER_INIT,
    seams.MODULE_REDUCE,
    seams.TORCH_COMPILE,
    seams.JIT_SCRIPT,
    *(
        seam
        for name in ("cross_entropy", "nll_loss", "mse_loss", "dropout", "dropout2d")
        if (seam := seams.functional(name)) is not None
    ),
]
ORIGINALS = {seam.name: seam.current for seam in ATTRIBUTE_SEAMS}
#: torch's global hook dictionaries, which must be as empty after as before.
GLOBAL_HOOKS = {
    "module forward pre": torch_module._global_forward_pre_hooks,
    "module parameter registration": torch_module._global_parameter_registration_hooks,
    "module registration": torch_module._global_module_registration_hooks,
    "optimizer step pre": torch_optimizer._global_optimizer_pre_hooks,
    "optimizer step post": torch_optimizer._global_optimizer_post_hooks,
}
HOOKS_BEFORE = {name: dict(hooks) for name, hooks in GLOBAL_HOOKS.items()}


def _assert_all_torch_own() -> None:
    for seam in ATTRIBUTE_SEAMS:
        assert seam.current is ORIGINALS[seam.name], f"{seam.name} is still patched"
    for name, hooks in GLOBAL_HOOKS.items():
        assert dict(hooks) == HOOKS_BEFORE[name], f"a global {name} hook is left"
    assert seams.BACKWARD.layers == () and seams.MODULE_FORWARD_PRE_HOOK.layers == ()


# --- the registry on its own ------------------------------------------------------------


def test_layers_chain_by_order_whatever_order_they_came_in() -> None:
    owner = types.SimpleNamespace(f=lambda x: [x])
    original = owner.f
    seam = Seam("owner.f", lambda: owner, "f")
    registry = PatchRegistry()

    def tagging(tag: str) -> Layer:
        return Layer(tag, lambda proceed, x: [tag, *proceed(x)], order=ord(tag))

    b, a, c = tagging("b"), tagging("a"), tagging("c")
    for layer in (b, a, c):
        registry.add(seam, layer)
    assert owner.f(0) == ["a", "b", "c", 0]
    assert registry.patched() == {"owner.f": ["a", "b", "c"]}
    stand_in = owner.f
    registry.remove(seam, a)
    assert owner.f is stand_in and owner.f(0) == ["b", "c", 0]
    registry.remove(seam, c)
    registry.remove(seam, b)
    assert owner.f is original
    assert registry.patched() == {}
    registry.remove(seam, b)  # twice: nothing
    assert owner.f is original


def test_a_layer_added_by_several_holders_goes_with_the_last() -> None:
    """The clip's layer is added by every open probe: one entry in the chain, taken off
    only when the last of them removes it (a remove too many is nothing)."""
    owner = types.SimpleNamespace(f=lambda x: x)
    original = owner.f
    seam = Seam("owner.f", lambda: owner, "f")
    registry, calls = PatchRegistry(), []
    shared = Layer("shared", lambda proceed, x: calls.append(x) or proceed(x))
    registry.add(seam, shared)
    registry.add(seam, shared)
    assert owner.f(1) == 1 and calls == [1]  # in the chain once
    registry.remove(seam, shared)
    assert owner.f is not original and registry.patched() == {"owner.f": ["shared"]}
    registry.remove(seam, shared)
    assert owner.f is original
    registry.remove(seam, shared)
    assert owner.f is original and registry.patched() == {}


def test_the_same_stand_in_comes_back_for_the_same_original() -> None:
    """Code compiled while a stand-in stood guards on its identity: no recompile when an
    evaluation's layer comes back."""
    owner = types.SimpleNamespace(f=lambda x: x)
    seam = Seam("owner.f", lambda: owner, "f")
    registry, layer = PatchRegistry(), Layer("l", lambda proceed, x: proceed(x))
    registry.add(seam, layer)
    first = owner.f
    registry.remove(seam, layer)
    registry.add(seam, layer)
    assert owner.f is first
    registry.remove(seam, layer)


def test_an_inherited_method_is_deleted_not_set_on_restore() -> None:
    class Base:
        def run(self) -> str:
            return "base"

    class Child(Base):
        pass

    seam = Seam("Child.run", lambda: Child, "run")
    registry = PatchRegistry()
    layer = registry.add(seam, Layer("l", lambda proceed, self: "patched " + proceed(self)))
    assert Child().run() == "patched base"
    registry.remove(seam, layer)
    assert "run" not in vars(Child)
    assert Child().run() == "base"


def test_a_patch_made_over_ours_is_left_in_place() -> None:
    owner = types.SimpleNamespace(f=lambda x: x + 1)
    original = owner.f
    seam = Seam("owner.f", lambda: owner, "f")
    registry = PatchRegistry()
    layer = registry.add(seam, Layer("ours", lambda proceed, x: proceed(x) * 10))
    ours = owner.f

    def theirs(x: int) -> int:
        return ours(x) + 1000

    owner.f = theirs
    assert owner.f(1) == 1020
    registry.remove(seam, layer)
    assert owner.f is theirs  # not undone by us
    assert owner.f(1) == 1002  # ours passes through beneath theirs
    assert registry.patched() == {"owner.f": []}
    again = registry.add(seam, layer)  # a probe opens again: beneath theirs, as before
    assert owner.f is theirs and owner.f(1) == 1020
    registry.remove(seam, again)
    owner.f = original


def test_a_hook_seam_registers_one_hook_and_removes_it_with_the_last_layer() -> None:
    registered: list[object] = []

    class Handle:
        def __init__(self, hook: object) -> None:
            registered.append(hook)
            self.hook = hook

        def remove(self) -> None:
            registered.remove(self.hook)

    seam = HookSeam("hooks", Handle)
    registry, calls = PatchRegistry(), []
    one = registry.add(seam, Layer("one", lambda *a: calls.append(("one", a)), order=2))
    two = registry.add(seam, Layer("two", lambda *a: calls.append(("two", a)), order=1))
    assert len(registered) == 1
    registered[0]("m", "args")  # type: ignore[operator]
    assert calls == [("two", ("m", "args")), ("one", ("m", "args"))]
    registry.remove(seam, two)
    assert len(registered) == 1
    registry.remove(seam, one)
    assert registered == []


# --- the probes: every global back, whatever the order ------------------------------------


def _train(probe_model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, 3)
        loss = nn.functional.cross_entropy(probe_model(x), torch.randint(0, 2, (4,)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(probe_model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    probe_model.eval()
    with torch.no_grad():
        nn.functional.cross_entropy(probe_model(torch.randn(4, 3)), torch.zeros(4).long())
    probe_model.train()


def _watched(kind: str) -> tuple[probes.Probe, nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, optimizer, run=kind)  # (no monitor: conftest's address)
    return probe, model, optimizer


@pytest.mark.parametrize("close_order", list(itertools.permutations(range(3))))
def test_every_global_is_torchs_own_after_the_probes_close_in_any_order(
    close_order: tuple[int, ...],
) -> None:
    _assert_all_torch_own()
    opened = [_watched(f"run {index}") for index in range(3)]
    try:
        for _, model, optimizer in opened:
            torch.amp.GradScaler("cpu").scale(torch.ones(()))  # (patched while open)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _train(model, optimizer, steps=3)
        assert seams.BACKWARD.current is not ORIGINALS[seams.BACKWARD.name]
        assert seams.MODULE_REDUCE.current is not ORIGINALS[seams.MODULE_REDUCE.name]
        listed = probes.patched()
        # autostep's one layer for every probe; each probe's own count of its passes;
        # the phases' one layer for every probe's clock, innermost
        assert listed[seams.BACKWARD.name] == [
            "autostep",
            *["undivided accumulation"] * 3,
            "phases",
        ]
        assert listed["torch.nn.utils.clip_grad_norm_"] == ["clip"]
    finally:
        for index in close_order:
            opened[index][0].close()
    _assert_all_torch_own()
    assert probes.patched() == {}


def test_the_step_api_and_an_anomaly_step_leave_nothing_behind() -> None:
    probe, model, optimizer = _watched("step api")
    try:
        for step in range(4):
            if step == 2:
                probe.arm_anomaly()
            with probe.step():
                loss = model(torch.randn(4, 3)).sum()
                loss.backward()
                if step == 2:  # the anomaly step's layer, outside the steps' own
                    assert REGISTRY.patched()[seams.BACKWARD.name][0] == "anomaly step"
                optimizer.step()
                optimizer.zero_grad()
    finally:
        probe.close()
    _assert_all_torch_own()
