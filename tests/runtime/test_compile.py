"""A compiled or wrapped model: training untouched, the eager parts measured, names the
user's.

Dynamo traces a forward hook like the rest of the forward: a hook of the probe there
would break the graph (other kernels: other bits, other dropout masks) or replay stale
state, and adding one recompiles. So the probe hooks no module inside a compiled
region (``probes.runtime.patches.hooks``), takes what it needs of the whole model where the
compiled model is entered, and its hooks step aside where they are traced anyway. A
compiled run watched is the same run, bit for bit (issue 20 item 3); the modules that
run eagerly are measured afresh on every sampled step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import probes
from probes.runtime.patches.hooks import compiled_modules, entry_pre_hook, unwrap
from probes.runtime.steps.first_forward import COMPILE_WARNING
from tests.collector import FrameCollector, wait_for_bye, watch_unthinned
from tests.compiled_gpt import Trained, compile_in_place, compile_wrapped, train_compiled


def dead_relu_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every ReLU output is zero: a dead fraction of 1
    return model


def first_layer_compiled_in_place(model: nn.Sequential) -> nn.Module:
    model[0].compile(backend="eager")  # dynamo's tracing, no code generation
    return model


def first_layer_forward_compiled(model: nn.Sequential) -> nn.Module:
    model[0].forward = torch.compile(model[0].forward, backend="eager")
    return model


@pytest.mark.parametrize(
    "compile_part", [first_layer_compiled_in_place, first_layer_forward_compiled]
)
def test_sampled_steps_measure_afresh_beside_a_compiled_part(
    collector: FrameCollector, compile_part: Callable[[nn.Sequential], nn.Module]
) -> None:
    torch._dynamo.reset()
    model = dead_relu_model()
    compiled = compile_part(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with watch_unthinned(compiled, optimizer, collector, sample_every=10) as probe:
        for _ in range(31):
            with probe.step():
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(compiled(x), y)
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
        with probe.evaluate():  # left in train mode and with grad on, on purpose
            probe.log(val_loss=nn.functional.mse_loss(compiled(x), y))
    wait_for_bye(collector)
    hello = collector.kinds("hello")[0]
    assert hello["layers"] == ["0", "2"]
    assert hello["activations"] == [["1", "relu", 0]]
    sampled = {f["step"]: f["activations"] for f in collector.kinds("step") if "activations" in f}
    assert sampled == {0: [1.0], 10: [1.0], 20: [1.0], 30: [1.0]}
    evaluation = collector.kinds("eval")[0]
    assert (
        evaluation["forwards"],
        evaluation["train_mode_forwards"],
        evaluation["grad_forwards"],
    ) == (1, 1, 1)


@pytest.mark.parametrize("compile_model", [compile_wrapped, compile_in_place])
def test_a_compiled_model_is_measured_where_it_is_entered(
    collector: FrameCollector, compile_model: Callable[..., nn.Module]
) -> None:
    """Inside a compiled model nothing is hooked: its activations are not counted (the
    hello lists none), its input's scale and the eval checks are taken at its entry."""
    torch._dynamo.reset()
    model = dead_relu_model()
    compiled = compile_model(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with watch_unthinned(compiled, optimizer, collector, sample_every=10) as probe:
        for _ in range(11):
            with probe.step():
                optimizer.zero_grad()
                nn.functional.mse_loss(compiled(x), y).backward()
                optimizer.step()
        with probe.evaluate():  # left in train mode and with grad on, on purpose
            probe.log(val_loss=nn.functional.mse_loss(compiled(x), y))
        model.eval()
        with probe.evaluate(), torch.no_grad():
            probe.log(val_loss=nn.functional.mse_loss(compiled(x), y))
    wait_for_bye(collector)
    assert collector.kinds("hello")[0]["activations"] == []
    sampled = [f for f in collector.kinds("step") if f["step"] in (0, 10)]
    assert [("activations" in f, f["input_rms"] > 0) for f in sampled] == [(False, True)] * 2
    counts = [
        (f["forwards"], f["train_mode_forwards"], f["grad_forwards"])
        for f in collector.kinds("eval")
    ]
    assert counts == [(1, 1, 1), (1, 0, 0)]
    assert model._compiled_call_impl is None or not hasattr(model._compiled_call_impl, "add")


def test_compiled_regions_are_the_insides_of_what_was_compiled() -> None:
    def tree() -> nn.Sequential:
        return nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))

    wrapper = torch.compile(tree(), backend="eager")  # (kept: a wrapper gone calls nothing)
    wrapped = unwrap(wrapper)
    assert compiled_modules(wrapped) == {id(m) for m in wrapped.modules()}
    in_place = tree()
    in_place[1].compile(backend="eager")
    assert compiled_modules(in_place) == {id(m) for m in in_place[1].modules()}
    forward = tree()
    forward[1].forward = torch.compile(forward[1].forward, backend="eager")
    assert compiled_modules(forward) == {id(forward[1][0]), id(forward[1][1])}
    assert compiled_modules(tree()) == set()


def test_an_entry_hook_on_a_module_compiled_in_place_is_taken_off_with_its_last() -> None:
    model = nn.Linear(2, 2)
    model.compile(backend="eager")
    compiled_call = model._compiled_call_impl
    seen: list[str] = []
    first = entry_pre_hook(model, lambda module, args: seen.append("first"))
    second = entry_pre_hook(model, lambda module, args: seen.append("second"))
    model(torch.ones(1, 2))
    first.remove()
    model(torch.ones(1, 2))
    assert model._compiled_call_impl is not compiled_call
    second.remove()
    second.remove()  # twice: nothing more
    model(torch.ones(1, 2))
    assert seen == ["first", "second", "second"]
    assert model._compiled_call_impl is compiled_call


def test_data_parallel_layer_names_are_the_modules_own(collector: FrameCollector) -> None:
    model = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)))
    with watch_unthinned(model, None, collector) as probe:
        assert probe.layers.names == ("0", "2")


# --- a compiled GPT trained with and without the probe (issue 20 item 3) ---------------


def probe_of(collector: FrameCollector) -> Callable[[nn.Module, torch.optim.Optimizer], object]:
    return lambda model, optimizer: watch_unthinned(model, optimizer, collector, sample_every=3)


def assert_untouched(bare: Trained, watched: Trained) -> None:
    assert watched.graph_breaks == bare.graph_breaks == {}
    assert watched.graphs == bare.graphs  # the probe compiled nothing of its own
    assert watched.graphs == watched.graphs_after_warm_up  # nor recompiled later
    assert watched.losses == bare.losses
    assert watched.weights.keys() == bare.weights.keys()
    differ = [k for k in bare.weights if not torch.equal(bare.weights[k], watched.weights[k])]
    assert differ == []


def assert_measured(collector: FrameCollector) -> None:
    wait_for_bye(collector)
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == list(range(12))
    assert all(all(n > 0 for n in f["grad_norms"]) for f in steps)
    assert [f["step"] for f in steps if "param_norms" in f] == [0, 3, 6, 9]
    evals = [(f["train_mode_forwards"], f["grad_forwards"]) for f in collector.kinds("eval")]
    assert evals == [(0, 0), (1, 1)]


@pytest.mark.parametrize("compile_model", [compile_wrapped, compile_in_place])
def test_a_compiled_gpt_trains_the_same_watched(
    collector: FrameCollector, compile_model: Callable[..., nn.Module]
) -> None:
    """Dynamo and AOTAutograd (the graphs, their breaks and guards), with dropout."""
    bare = train_compiled(compile_model, None, backend="aot_eager")
    watched = train_compiled(compile_model, probe_of(collector), backend="aot_eager")
    assert_untouched(bare, watched)
    assert_measured(collector)


@pytest.mark.parametrize(
    "compile_model",
    [pytest.param(compile_wrapped, marks=pytest.mark.slow), compile_in_place],  # (-m slow)
)
def test_a_compiled_gpt_trains_the_same_under_watch_alone(
    collector: FrameCollector, compile_model: Callable[..., nn.Module]
) -> None:
    """``watch()`` and nothing else: step 0 is found by a global forward pre-hook, which
    must never run (nor be traced) inside the compiled region; the same graphs, no
    break, no recompile, the same bits, and every step measured."""
    bare = train_compiled(compile_model, None, backend="aot_eager", step_api=False)
    watched = train_compiled(
        compile_model, probe_of(collector), backend="aot_eager", step_api=False
    )
    assert_untouched(bare, watched)
    wait_for_bye(collector)
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == list(range(12))
    assert all(all(n > 0 for n in f["grad_norms"]) for f in steps)
    assert [f["scalars"]["loss"] for f in steps] == watched.losses  # each step's own


@pytest.mark.slow  # Inductor's C++ compile: minutes cold on a loaded machine (-m slow)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_gpt_compiled_by_inductor_trains_the_same_watched(
    collector: FrameCollector, mode: str
) -> None:
    """Inductor's kernels and its dropout (seeds drawn per compiled call): the same
    graphs give the same bits. One thread: the backward of an embedding adds into its
    gradient with atomics, in an order that varies between runs on several threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bare = train_compiled(compile_in_place, None, mode=mode)
        watched = train_compiled(compile_in_place, probe_of(collector), mode=mode)
    finally:
        torch.set_num_threads(threads)
    assert_untouched(bare, watched)
    assert_measured(collector)


def ours_filtering() -> bool:
    """Is the probe's filter of torch.compile's warning among the warning filters?"""
    return any(f[1] is not None and f[1].pattern == COMPILE_WARNING for f in warnings.filters)


def compiled_calls_warn(user_global_hook: bool) -> tuple[list[str], bool, bool]:
    """The warnings ``torch.compile(model)`` prints through a run watched by ``watch()``
    alone (its step 0 found by a global forward pre-hook, there until the first
    forward); whether the probe's filter was there before it, and after the run."""
    torch._dynamo.reset()
    model = dead_relu_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # (before the probe's filter: that one comes first)
        own = (
            torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
            if user_global_hook
            else None
        )
        probe = probes.watch(model, optimizer, address="tcp://127.0.0.1:9")
        before = ours_filtering()
        compiled = torch.compile(model, backend="eager")
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.mse_loss(compiled(x), y).backward()
            optimizer.step()
        after = ours_filtering()
        probe.close()
        if own is not None:
            own.remove()
    return [str(w.message) for w in caught if "global hooks" in str(w.message)], before, after


def test_the_probes_global_hook_makes_torch_compile_print_nothing() -> None:
    # the filter there while the hook is, gone with it
    assert compiled_calls_warn(user_global_hook=False) == ([], True, False)


def test_a_global_hook_of_the_users_own_keeps_torch_compiles_warning() -> None:
    messages, before, after = compiled_calls_warn(user_global_hook=True)
    assert len(messages) == 3 and not before and not after  # one a call ("always")
