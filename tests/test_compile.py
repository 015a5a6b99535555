"""A compiled or wrapped model: the probe's hooks still measure, names stay the user's.

Dynamo traces a forward hook like the rest of the forward; a hook whose Python side
effects were traced once would replay stale state on later sampled steps. The probe's
hooks run eagerly (``probes.runtime.hooks.eager``), so every sampled step measures afresh.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.collector import FrameCollector, wait_for_bye, watch_unthinned


def dead_relu_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every ReLU output is zero: a dead fraction of 1
    return model


def compiled_wrapper(model: nn.Module) -> nn.Module:
    return torch.compile(model, backend="eager")  # dynamo's tracing, no code generation


def compiled_in_place(model: nn.Module) -> nn.Module:
    model.compile(backend="eager")
    return model


@pytest.mark.parametrize("compile_model", [compiled_wrapper, compiled_in_place])
def test_sampled_steps_measure_afresh_under_torch_compile(
    collector: FrameCollector, compile_model: Callable[[nn.Module], nn.Module]
) -> None:
    torch._dynamo.reset()
    model = dead_relu_model()
    compiled = compile_model(model)
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


def test_data_parallel_layer_names_are_the_modules_own(collector: FrameCollector) -> None:
    model = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)))
    with watch_unthinned(model, None, collector) as probe:
        assert probe.layers.names == ("0", "2")
