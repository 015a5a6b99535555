"""Each layer's largest gradient element (``grad_max``), measured on the device on
sampled steps: unclipped, a NaN kept, a layer without a gradient left out, and not
measured where several optimizers read their gradients apart."""

from __future__ import annotations

import math

import torch
from torch import nn

from tests.collector import FrameCollector, watch_unthinned
from tests.runtime.test_probe_measurements import close_and_collect, linear_layers, loss_of, mlp


def largest_elements(model: nn.Module) -> list[float]:
    """Per linear layer, its gradients' largest |element|, read the plain way."""
    return [
        max(p.grad.abs().max().item() for p in layer.parameters() if p.grad is not None)
        for layer in linear_layers(model)
    ]


def test_grad_max_is_each_layers_largest_element_before_the_clip(
    collector: FrameCollector,
) -> None:
    model = mlp(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, opt, collector, sample_every=2)
    expected: dict[int, list[float]] = {}
    for i in range(5):
        with probe.step():
            opt.zero_grad()
            loss_of(model, i).backward()
            expected[i] = largest_elements(model)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # cuts every element
            assert max(largest_elements(model)) < 0.5 * max(expected[i])
            opt.step()
    records = close_and_collect(probe, collector)

    for i in (0, 2, 4):  # sampled: the unclipped elements, per layer
        got = records[i]["grad_max"]
        assert len(got) == len(expected[i])
        for value, want in zip(got, expected[i], strict=True):
            assert value is not None and math.isclose(value, want, rel_tol=1e-6)
    for i in (1, 3):
        assert "grad_max" not in records[i]


def test_a_nan_in_one_parameter_makes_its_layers_peak_nan_and_a_layer_without_grads_none(
    collector: FrameCollector,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, opt, collector, sample_every=1)
    with probe.step():
        opt.zero_grad()
        out = model[2](model[1](model[0](torch.randn(3, 4))))
        out.sum().backward()
        model[2].bias.grad = None  # the layer keeps its weight's gradient
        model[0].weight.grad = None
        model[0].bias.grad = None  # no gradient at all in the first layer
        assert model[1].bias.grad is not None
        model[1].bias.grad[1] = math.nan  # the bias: the weight's elements are larger
        opt.step()
    [record] = close_and_collect(probe, collector).values()

    first, second, last = record["grad_max"]
    assert first is None
    assert second is not None and math.isnan(second)
    assert math.isclose(last, model[2].weight.grad.abs().max().item(), rel_tol=1e-6)


def test_several_optimizers_do_not_measure_it(collector: FrameCollector) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[1].parameters(), lr=0.1)
    probe = watch_unthinned(model, [first, second], collector, sample_every=1)
    with probe.step():
        first.zero_grad()
        second.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        first.step()
        second.step()
    [record] = close_and_collect(probe, collector).values()

    assert "grad_norms" in record and "grad_max" not in record


def test_under_a_grad_scaler_it_is_the_unscaled_gradients_largest_element(
    collector: FrameCollector,
) -> None:
    model = mlp(5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    probe = watch_unthinned(model, opt, collector, sample_every=1)
    expected: dict[int, list[float]] = {}
    for i in range(3):
        with probe.step():
            opt.zero_grad()
            scaler.scale(loss_of(model, i)).backward()
            scaler.step(opt)  # unscales in place, then steps: the grads read are unscaled
            scaler.update()
            expected[i] = largest_elements(model)
    records = close_and_collect(probe, collector)

    for i, want in expected.items():
        assert "grads_scaled" not in records[i]
        for value, unscaled in zip(records[i]["grad_max"], want, strict=True):
            assert value is not None and math.isclose(value, unscaled, rel_tol=1e-6)
