"""Layer mapping and per-layer norms: the probe's numbers against a naive computation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

import probes
from probes.runtime.measure.layers import (
    ROOT_LAYER_NAME,
    combine_layer_norms,
    count_parameters,
    map_layers,
)
from probes.runtime.measure.stats import NormReducer, compose_order
from tests.collector import FrameCollector

REL_TOL = 1e-5


# --- models ----------------------------------------------------------------------------


class Inner(nn.Module):
    """A submodule that owns a parameter directly, plus a child layer."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x * self.scale)


class Net(nn.Module):
    """Nested modules, a frozen layer, a tied weight and a parameter on the root."""

    def __init__(self, *, with_unused: bool = False) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.tensor(1.25))
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
        self.inner = Inner()
        self.frozen = nn.Linear(4, 4)
        for param in self.frozen.parameters():
            param.requires_grad_(False)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.embed.weight  # tied: (10, 4) in both
        self.unused = nn.Linear(4, 3) if with_unused else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = self.body(h)
        h = self.inner(h)
        h = self.frozen(h)
        return self.head(h) * self.temperature


def expected_layers(model: Net) -> dict[str, list[nn.Parameter]]:
    """The layers of ``Net`` written out by hand (independent of ``map_layers``)."""
    layers = {
        ROOT_LAYER_NAME: [model.temperature],
        "embed": [model.embed.weight],
        "body.0": [model.body[0].weight, model.body[0].bias],
        "body.2": [model.body[2].weight, model.body[2].bias],
        "inner": [model.inner.scale],
        "inner.proj": [model.inner.proj.weight, model.inner.proj.bias],
        "head": [model.head.bias],  # head.weight is embed.weight, counted under embed
    }
    if model.unused is not None:
        layers["unused"] = [model.unused.weight, model.unused.bias]
    return layers


class MixedDtypes(nn.Module):
    """A float64 layer between two float32 ones, so the dtype grouping reorders."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 5)
        self.wide = nn.Linear(5, 5).double()
        self.last = nn.Linear(5, 2)
        self.idle = nn.Linear(2, 2)  # never used in forward: no gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x)).double()
        h = torch.tanh(self.wide(h)).float()
        return self.last(h)


def mixed_expected_layers(model: MixedDtypes) -> dict[str, list[nn.Parameter]]:
    return {name: [m.weight, m.bias] for name, m in model.named_children()}


# --- naive reference ---------------------------------------------------------------------


def naive_norms(
    layers: dict[str, list[nn.Parameter]], value: Callable[[nn.Parameter], torch.Tensor | None]
) -> dict[str, float | None]:
    """Per layer: sqrt(sum over its params of norm**2), in float64; None if nothing."""
    out: dict[str, float | None] = {}
    for name, params in layers.items():
        tensors = [value(p) for p in params]
        present = [t for t in tensors if t is not None]
        if not present:
            out[name] = None
            continue
        total = sum(float(t.detach().double().norm()) ** 2 for t in present)
        out[name] = math.sqrt(total)
    return out


def naive_total(norms: dict[str, float | None]) -> float:
    return math.sqrt(sum(n * n for n in norms.values() if n is not None))


def assert_close(actual: float | None, expected: float | None, what: str) -> None:
    if expected is None:
        assert actual is None, f"{what}: expected None, got {actual}"
        return
    assert actual is not None, f"{what}: expected {expected}, got None"
    assert expected > 0, f"{what}: the reference norm is zero; the test would prove nothing"
    rel = abs(actual - expected) / expected
    assert rel < REL_TOL, f"{what}: {actual} vs {expected} (relative error {rel:.2e})"


def assert_layer_norms(
    names: tuple[str, ...] | list[str],
    actual: list[float | None],
    expected: dict[str, float | None],
    what: str,
) -> None:
    assert list(names) == list(expected), f"{what}: layer order {names} vs {list(expected)}"
    assert len(actual) == len(expected)
    for name, value in zip(names, actual, strict=True):
        assert_close(value, expected[name], f"{what}[{name}]")


def tokens_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (16,), generator=generator)
    y = torch.randint(0, 10, (16,), generator=generator)
    return x, y


def start_probe(
    model: nn.Module, optimizer: torch.optim.Optimizer, collector: FrameCollector, **options: object
) -> probes.Probe:
    # No thinning: every step must reach the collector as its own frame.
    return probes.watch(model, optimizer, address=collector.address, max_steps_per_s=1e9, **options)


def received_steps(collector: FrameCollector, count: int) -> dict[int, dict]:
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames)), (
        "the probe never said bye"
    )
    steps = collector.kinds("step")
    assert all("span" not in f for f in steps), "step frames were thinned"
    by_step = {f["step"]: f for f in steps}
    assert sorted(by_step) == list(range(count))
    return by_step


# --- map_layers --------------------------------------------------------------------------


def test_map_layers_names_frozen_tied_and_counts() -> None:
    torch.manual_seed(0)
    model = Net()
    layer_map = map_layers(model)

    expected = expected_layers(model)
    assert layer_map.names == tuple(expected)
    assert layer_map.names[0] == "(root)"
    assert "frozen" not in layer_map.names
    assert all(
        p is not model.frozen.weight and p is not model.frozen.bias for p in layer_map.params
    )

    # The tied weight appears once, under its first owner (embed), not under head.
    tied = model.embed.weight
    assert model.head.weight is tied
    assert sum(1 for p in layer_map.params if p is tied) == 1
    tied_index = next(i for i, p in enumerate(layer_map.params) if p is tied)
    assert layer_map.names[layer_map.param_layer[tied_index]] == "embed"
    assert layer_map.param_names[tied_index] == "embed.weight"

    assert layer_map.param_counts == (1, 40, 4 * 8 + 8, 8 * 4 + 4, 4, 4 * 4 + 4, 10)
    assert sum(layer_map.param_counts) == count_parameters(model)
    assert layer_map.param_names == (
        "temperature",
        "embed.weight",
        "body.0.weight",
        "body.0.bias",
        "body.2.weight",
        "body.2.bias",
        "inner.scale",
        "inner.proj.weight",
        "inner.proj.bias",
        "head.bias",
    )
    for name, params in expected.items():
        layer = layer_map.names.index(name)
        owned = [
            p
            for p, owner in zip(layer_map.params, layer_map.param_layer, strict=True)
            if owner == layer
        ]
        assert owned == params


def test_map_layers_tied_weight_owner_follows_module_order() -> None:
    # The same Parameter, assigned to a later-registered module first: named_modules
    # order decides, not assignment order.
    model = nn.Module()
    model.a = nn.Linear(3, 3, bias=False)
    model.b = nn.Linear(3, 3, bias=False)
    model.a.weight = model.b.weight
    layer_map = map_layers(model)
    assert layer_map.names == ("a",)
    assert layer_map.param_counts == (9,)


class TinyGPT(nn.Module):
    """A GPT's naming: the token embedding tied to the output head (no bias), and a
    block registered under two names (its weights shared as a whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {"wte": nn.Embedding(10, 4), "h": nn.ModuleList([nn.Linear(4, 4)])}
        )
        self.shared = self.transformer["h"][0]
        self.lm_head = nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.transformer["wte"].weight


def test_map_layers_names_every_module_that_shares_a_tied_weight() -> None:
    layer_map = map_layers(TinyGPT())
    assert layer_map.names == ("transformer.wte", "transformer.h.0")  # the first owners
    assert layer_map.tied == {"transformer.wte": ("lm_head",), "transformer.h.0": ("shared",)}
    assert map_layers(Net()).tied == {"embed": ("head",)}  # head keeps a row: its bias
    assert map_layers(nn.Sequential(nn.Linear(2, 2))).tied == {}


def test_the_hello_carries_tied_names_and_the_monitor_shows_them(
    collector: FrameCollector,
) -> None:
    from probes.kernel.schema import RunInfo

    probe = probes.watch(TinyGPT(), address=collector.address)
    probe.close()
    assert collector.wait_for(lambda frames: any(f["kind"] == "hello" for f in frames))
    [hello] = collector.kinds("hello")
    assert hello["tied"] == {"transformer.wte": ["lm_head"], "transformer.h.0": ["shared"]}
    info = RunInfo.from_hello(hello)
    assert info.layer_label("transformer.wte") == "transformer.wte (= lm_head)"
    assert info.layer_label("transformer.h.0") == "transformer.h.0 (= shared)"
    assert RunInfo.from_hello({"layers": ["a"]}).layer_label("a") == "a"


def test_map_layers_root_only_and_fully_frozen() -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3, 2))

    layer_map = map_layers(Bare())
    assert layer_map.names == ("(root)",)
    assert layer_map.param_names == ("w",)
    assert layer_map.param_counts == (6,)

    frozen = nn.Linear(2, 2).requires_grad_(False)
    empty = map_layers(frozen)
    assert empty.names == ()
    assert empty.params == ()


# --- norms against a naive computation ---------------------------------------------------


def test_batched_norms_and_combine_match_naive() -> None:
    torch.manual_seed(1)
    model = Net()
    x, y = tokens_batch(1)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()

    layer_map = map_layers(model)
    grads = [p.grad for p in layer_map.params]
    assert all(g is not None for g in grads)
    norms, order = NormReducer().norms(grads)
    vector = torch.stack(norms)
    assert order is None  # one dtype, one device: the natural order
    assert vector.dtype == torch.float32
    per_layer = combine_layer_norms(vector.tolist(), order, layer_map)

    expected = naive_norms(expected_layers(model), lambda p: p.grad)
    assert_layer_norms(layer_map.names, per_layer, expected, "grad_norms")


def test_probe_step_frames_match_naive(collector: FrameCollector) -> None:
    torch.manual_seed(2)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    layers = expected_layers(model)
    steps = 6
    naive_grads: list[dict[str, float | None]] = []
    naive_params: list[dict[str, float | None]] = []

    probe = start_probe(model, optimizer, collector, sample_every=2)
    for i in range(steps):
        x, y = tokens_batch(100 + i)
        with probe.step():
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            naive_grads.append(naive_norms(layers, lambda p: p.grad))
            optimizer.step()
            naive_params.append(naive_norms(layers, lambda p: p))
            probe.log(loss=loss)
    probe.close()

    frames = received_steps(collector, steps)
    hello = collector.kinds("hello")[0]
    assert hello["layers"] == list(layers)
    for i in range(steps):
        frame = frames[i]
        assert_layer_norms(
            hello["layers"], frame["grad_norms"], naive_grads[i], f"step {i} grad_norms"
        )
        assert_close(
            frame["grad_norm_total"], naive_total(naive_grads[i]), f"step {i} grad_norm_total"
        )
        assert frame["none_grads"] == 0
        if i % 2 == 0:
            assert "param_norms" in frame, f"step {i} is sampled but has no param_norms"
            assert_layer_norms(
                hello["layers"], frame["param_norms"], naive_params[i], f"step {i} param_norms"
            )
        else:
            assert "param_norms" not in frame, f"step {i} is not sampled"
    # The parameters moved between sampled steps, so the comparison is not vacuous.
    assert naive_params[0]["body.0"] != naive_params[2]["body.0"]


def test_probe_measures_before_torch_clipping(collector: FrameCollector) -> None:
    # Gradients are read before torch's clip_grad_norm_ scales them (the lesson: log the
    # unclipped norm), not just before optimizer.step().
    torch.manual_seed(3)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    layers = expected_layers(model)
    probe = start_probe(model, optimizer, collector)
    naive: list[dict[str, float | None]] = []
    for i in range(3):
        x, y = tokens_batch(200 + i)
        with probe.step():
            loss = nn.functional.cross_entropy(model(x), y) * 50
            optimizer.zero_grad()
            loss.backward()
            naive.append(naive_norms(layers, lambda p: p.grad))
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            optimizer.step()
            optimizer.zero_grad()  # gone by the end of the step: the pre-hook had them
            probe.log(loss=loss)
    probe.close()
    frames = received_steps(collector, 3)
    for i in range(3):
        assert_close(frames[i]["grad_norm_total"], naive_total(naive[i]), f"step {i} total")
        assert frames[i]["grad_norm_total"] > 1.0  # unclipped: well above the max norm
        assert frames[i]["clip"]["total_after"] == pytest.approx(0.5, rel=1e-4)
        assert frames[i]["none_grads"] == 0


def test_unused_layer_reports_none(collector: FrameCollector) -> None:
    torch.manual_seed(4)
    model = Net(with_unused=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    layers = expected_layers(model)
    naive: list[dict[str, float | None]] = []
    probe = start_probe(model, optimizer, collector)
    for i in range(3):
        x, y = tokens_batch(300 + i)
        with probe.step():
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            naive.append(naive_norms(layers, lambda p: p.grad))
            optimizer.step()
            probe.log(loss=loss)
    probe.close()

    assert model.unused is not None and model.unused.weight.grad is None
    frames = received_steps(collector, 3)
    names = collector.kinds("hello")[0]["layers"]
    assert names[-1] == "unused"
    for i in range(3):
        frame = frames[i]
        assert frame["grad_norms"][-1] is None
        assert frame["none_grads"] == 2
        assert_layer_norms(names, frame["grad_norms"], naive[i], f"step {i} grad_norms")
        assert_close(frame["grad_norm_total"], naive_total(naive[i]), f"step {i} total")


def test_batched_norms_mixed_dtypes_match_naive() -> None:
    torch.manual_seed(5)
    model = MixedDtypes()
    model(torch.randn(7, 6)).square().mean().backward()
    layer_map = map_layers(model)
    present = tuple(i for i, p in enumerate(layer_map.params) if p.grad is not None)
    grads = [layer_map.params[i].grad for i in present]
    assert len(present) == 6  # idle has none

    norms, order = NormReducer().norms(grads)
    vector = torch.stack(norms)
    assert vector.dtype == torch.float64
    assert order is not None and sorted(order) == list(range(6))
    assert list(order) != list(range(6)), "the float64 group should reorder the norms"
    per_layer = combine_layer_norms(vector.tolist(), compose_order(present, order), layer_map)

    expected = naive_norms(mixed_expected_layers(model), lambda p: p.grad)
    assert expected["idle"] is None
    assert_layer_norms(layer_map.names, per_layer, expected, "grad_norms")

    # Parameter norms too (all present, same grouping).
    norms, order = NormReducer().norms([p.detach() for p in layer_map.params])
    vector = torch.stack(norms)
    per_layer = combine_layer_norms(vector.tolist(), order, layer_map)
    expected = naive_norms(mixed_expected_layers(model), lambda p: p)
    assert_layer_norms(layer_map.names, per_layer, expected, "param_norms")


def test_probe_mixed_dtypes_match_naive(collector: FrameCollector) -> None:
    torch.manual_seed(6)
    model = MixedDtypes()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    layers = mixed_expected_layers(model)
    naive_grads: list[dict[str, float | None]] = []
    naive_params: list[dict[str, float | None]] = []
    losses: list[float] = []
    probe = start_probe(model, optimizer, collector, sample_every=1)
    for i in range(4):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(400 + i))
        with probe.step():
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            naive_grads.append(naive_norms(layers, lambda p: p.grad))
            optimizer.step()
            naive_params.append(naive_norms(layers, lambda p: p))
            probe.log(loss=loss)
            losses.append(loss.item())
    probe.close()

    frames = received_steps(collector, 4)
    names = collector.kinds("hello")[0]["layers"]
    assert names == list(layers)
    for i in range(4):
        frame = frames[i]
        assert frame["none_grads"] == 2
        assert frame["grad_norms"][names.index("idle")] is None
        assert_layer_norms(names, frame["grad_norms"], naive_grads[i], f"step {i} grad_norms")
        assert_close(frame["grad_norm_total"], naive_total(naive_grads[i]), f"step {i} total")
        assert_layer_norms(names, frame["param_norms"], naive_params[i], f"step {i} params")
        assert frame["scalars"]["loss"] == pytest.approx(losses[i], rel=1e-6)


async def test_the_layer_table_names_a_tied_layer_by_every_name() -> None:
    from tests.frames import LAYERS, hello, short_run
    from tests.waiting import settle
    from tui.app import make_app
    from tui.sources import FrameListSource
    from tui.widgets import LayerTable

    first, *rest = short_run(5)
    assert first["kind"] == "hello"
    tied = {**hello(), "tied": {LAYERS[0]: ["decoder.out"]}}
    app = make_app(FrameListSource([tied, *rest]))
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(LayerTable)
        await settle(
            pilot, lambda: table.row_count == len(LAYERS) and table.row_text(LAYERS[0])[1] != "-"
        )
        assert table.row_text(LAYERS[0])[0] == f"{LAYERS[0]} (= decoder.out)"
        assert table.row_text(LAYERS[1])[0] == LAYERS[1]


def test_map_layers_walks_the_modules_in_torchs_order_and_survives_a_cycle() -> None:
    model = Net()
    model.body.owner = model  # type: ignore[assignment]  (a module that holds its parent)
    assert map_layers(model).names == map_layers(Net()).names
    gpt = TinyGPT()
    first = [name for name, _ in gpt.named_modules()]
    kept = map_layers(gpt).names
    assert list(kept) == [name for name in first if name in kept]
