"""The probe's training-side measurements against naive computations in the test:
unclipped norms with ``probes.clip_grad_norm_``, update ratios, activation health,
uncleared and missing gradients, mode-sensitive modules, hook removal, and failures
that must never reach the training loop."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

import probes
import probes.runtime.measure.measurer
import probes.runtime.measure.sampled
import probes.runtime.measure.stats
from probes.kernel.diagnosis import Diagnoser, RunInfo
from probes.runtime.optimizers.clip import torch_clip_grad_norm_ as clip_grad_norm_of_torch
from tests.collector import Frame, FrameCollector, wait_for_bye, watch_unthinned

REL_TOL = 1e-5

# --- helpers (copied in spirit from test_probe.py) ------------------------------------


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    )


def batch(seed: int, size: int = 16, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 8, generator=generator) * scale
    y = torch.randint(0, 3, (size,), generator=generator)
    return x, y


def loss_of(model: nn.Module, seed: int, scale: float = 1.0) -> torch.Tensor:
    x, y = batch(seed, scale=scale)
    return nn.functional.cross_entropy(model(x), y)


def close_and_collect(probe: probes.Probe, collector: FrameCollector) -> dict[int, Frame]:
    """Close the probe, wait for its bye; the step records by step index."""
    probe.close()
    wait_for_bye(collector)
    assert collector.errors == []
    records = collector.kinds("step")
    by_step = {f["step"]: f for f in records}
    assert len(by_step) == len(records), "a step was recorded twice"
    return by_step


def hello_of(collector: FrameCollector) -> Frame:
    hellos = collector.kinds("hello")
    assert hellos, "no hello arrived"
    return hellos[0]


def traintop_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("traintop:")]


def linear_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def layer_norm(tensors: list[torch.Tensor]) -> float:
    """L2 norm of several tensors taken together, in float64."""
    return torch.cat([t.detach().double().flatten() for t in tensors]).norm().item()


def grad_layer_norms(model: nn.Module) -> list[float]:
    return [layer_norm([p.grad for p in layer.parameters()]) for layer in linear_layers(model)]


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def assert_close_list(actual: list[float | None], expected: list[float], rel: float) -> None:
    assert len(actual) == len(expected), (actual, expected)
    for got, want in zip(actual, expected, strict=True):
        assert got is not None
        assert rel_err(got, want) < rel, (actual, expected)


# --- 1. probes.clip_grad_norm_ ---------------------------------------------------------


def test_probes_clip_is_bit_identical_to_torch_and_records_unclipped_norms(
    collector: FrameCollector,
) -> None:
    reference = mlp(1)
    probed = copy.deepcopy(reference)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(probed.parameters(), lr=0.1)
    max_norm = 0.05
    probe = watch_unthinned(probed, opt, collector)
    expected = []
    for i in range(3):
        ref_opt.zero_grad()
        loss_of(reference, i).backward()
        ref_total = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
        with probe.step():
            opt.zero_grad()
            loss = loss_of(probed, i)
            loss.backward()
            unclipped = grad_layer_norms(probed)
            total = probes.clip_grad_norm_(probed.parameters(), max_norm)
            clipped = grad_layer_norms(probed)
            assert torch.equal(total, ref_total)
            for mine, theirs in zip(probed.parameters(), reference.parameters(), strict=True):
                assert mine.grad is not None and theirs.grad is not None
                assert torch.equal(mine.grad, theirs.grad)
            opt.step()
            probe.log(loss=loss)
        ref_opt.step()
        # Clipping really cut the gradients, so unclipped and clipped norms differ.
        assert total.item() > 2 * max_norm
        assert all(c < 0.9 * u for c, u in zip(clipped, unclipped, strict=True))
        expected.append((unclipped, total.item()))
    for mine, theirs in zip(probed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    records = close_and_collect(probe, collector)

    assert sorted(records) == [0, 1, 2]
    for i, (unclipped, total) in enumerate(expected):
        record = records[i]
        clip = record["clip"]
        assert clip["max_norm"] == max_norm and clip["norm_type"] == 2.0
        assert clip["total_before"] == total  # torch's own total, as it returned it
        assert rel_err(clip["total_after"], max_norm) < REL_TOL  # clipped down to max_norm
        assert_close_list(record["grad_norms"], unclipped, REL_TOL)
        assert rel_err(record["grad_norm_total"], total) < REL_TOL


@pytest.mark.parametrize(
    "options",
    [{"norm_type": math.inf}, {"norm_type": 1.0, "foreach": False}, {"error_if_nonfinite": True}],
    ids=["inf", "l1-no-foreach", "error-if-nonfinite"],
)
def test_probes_clip_matches_torch_for_other_arguments(
    options: dict[str, object], collector: FrameCollector
) -> None:
    reference = mlp(2)
    probed = copy.deepcopy(reference)
    opt = torch.optim.SGD(probed.parameters(), lr=0.1)
    probe = watch_unthinned(probed, opt, collector)
    loss_of(reference, 0).backward()
    ref_total = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01, **options)
    with probe.step():
        loss_of(probed, 0).backward()
        total = probes.clip_grad_norm_(probed.parameters(), 0.01, **options)
        opt.step()
    assert torch.equal(total, ref_total)
    for mine, theirs in zip(probed.parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and torch.equal(mine.grad, theirs.grad)
    records = close_and_collect(probe, collector)
    assert records[0]["clip"]["max_norm"] == 0.01
    assert records[0]["clip"]["norm_type"] == options.get("norm_type", 2.0)
    assert records[0]["clip"]["total_before"] == total.item()


def test_torch_clip_is_seen_unclipped_and_changes_nothing(collector: FrameCollector) -> None:
    """Frameworks clip with torch.nn.utils.clip_grad_norm_ inside their own step: the
    probe records the norms from before it, and the clip itself, bit for bit the same."""
    reference = mlp(3)
    model = copy.deepcopy(reference)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    max_norm = 0.05
    probe = watch_unthinned(model, opt, collector)
    expected = []
    for i in range(2):
        with probe.step():
            opt.zero_grad()
            loss_of(model, i).backward()
            unclipped = grad_layer_norms(model)
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            clipped = grad_layer_norms(model)  # as they are just before optimizer.step()
            opt.step()
        ref_opt.zero_grad()
        loss_of(reference, i).backward()
        torch_total = clip_grad_norm_of_torch(reference.parameters(), max_norm)
        ref_opt.step()
        assert torch.equal(total, torch_total)
        assert all(c < 0.9 * u for c, u in zip(clipped, unclipped, strict=True))
        expected.append((unclipped, total.item()))
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    records = close_and_collect(probe, collector)
    probe_free = torch.nn.utils.clip_grad_norm_  # the probe closed: torch's own is back
    assert probe_free is clip_grad_norm_of_torch
    assert sorted(records) == [0, 1]
    for i, (unclipped, total) in enumerate(expected):
        record = records[i]
        assert_close_list(record["grad_norms"], unclipped, REL_TOL)
        assert record["clip"]["max_norm"] == max_norm
        assert record["clip"]["total_before"] == total
        assert rel_err(record["clip"]["total_after"], max_norm) < 1e-4


# --- 2. update ratios ----------------------------------------------------------------


def test_update_ratios_on_sampled_steps_match_naive(collector: FrameCollector) -> None:
    model = mlp(4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    probe = watch_unthinned(model, opt, collector, sample_every=2)
    layers = linear_layers(model)
    expected_ratios = []
    expected_weights = []
    for i in range(5):
        with probe.step():
            opt.zero_grad()
            loss_of(model, i).backward()
            before = [[p.detach().clone() for p in layer.parameters()] for layer in layers]
            opt.step()
        ratios = []
        weights = []
        for layer, old in zip(layers, before, strict=True):
            after = [p.detach() for p in layer.parameters()]
            delta = [a - b for a, b in zip(after, old, strict=True)]
            ratios.append(layer_norm(delta) / layer_norm(after))
            weights.append(layer_norm(after))
        expected_ratios.append(ratios)
        expected_weights.append(weights)
    records = close_and_collect(probe, collector)

    assert sorted(records) == [0, 1, 2, 3, 4]
    for i in (0, 2, 4):
        record = records[i]
        assert "update_ratios" in record, f"sampled step {i} has no update_ratios"
        assert all(r > 0 for r in expected_ratios[i])
        assert_close_list(record["update_ratios"], expected_ratios[i], 1e-4)
        assert_close_list(record["param_norms"], expected_weights[i], 1e-4)
    for i in (1, 3):
        assert "update_ratios" not in records[i]
        assert "param_norms" not in records[i]


def test_update_ratios_without_an_optimizer_span_the_step(collector: FrameCollector) -> None:
    """An optimizer not given to the probe updates inside the step: the sampled steps'
    ratios are taken across the step (issue 18 item 1: they used to be absent)."""
    model = mlp(5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # not given to the probe
    probe = probes.watch(model, address=collector.address, max_steps_per_s=1e9, sample_every=2)
    for i in range(4):
        with probe.step():
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
    records = close_and_collect(probe, collector)
    assert sorted(records) == [0, 1, 2, 3]
    assert "update_ratios" in records[0] and "update_ratios" in records[2]
    assert all(r > 0 for i in (0, 2) for r in records[i]["update_ratios"])
    assert "update_ratios" not in records[1] and "update_ratios" not in records[3]
    assert "param_norms" in records[0] and "param_norms" in records[2]
    assert "param_norms" not in records[1]
    assert hello_of(collector)["optimizer"] is None


# --- 3. activation health ------------------------------------------------------------


def activation_model(seed: int = 6) -> nn.Sequential:
    """ReLU, Tanh and Sigmoid modules; the tanh is fed by the third Linear, not the second."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(8, 32),  # 0: layer 0
        nn.ReLU(),  # 1
        nn.Linear(32, 32),  # 2: layer 1
        nn.Linear(32, 32),  # 3: layer 2
        nn.Tanh(),  # 4
        nn.Linear(32, 32),  # 5: layer 3
        nn.Sigmoid(),  # 6
        nn.Linear(32, 3),  # 7: layer 4
    )
    with torch.no_grad():  # push the tanh and sigmoid into partial saturation
        model[3].weight.mul_(6.0)
        model[5].weight.mul_(8.0)
    return model


def naive_fraction(family: str, y: torch.Tensor) -> tuple[int, int]:
    if family == "relu":
        hits = (y == 0).sum().item()
    elif family == "tanh":
        hits = (y.abs() > 0.99).sum().item()
    else:
        hits = ((y < 0.01) | (y > 0.99)).sum().item()
    return int(hits), y.numel()


def test_activation_fractions_match_naive_and_hello_lists_activations(
    collector: FrameCollector,
) -> None:
    model = activation_model()
    families = {1: "relu", 4: "tanh", 6: "sigmoid"}
    tallies: dict[int, list[int]] = {}

    def hook_for(index: int) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def hook(module: nn.Module, args: object, output: torch.Tensor) -> None:
            hits, total = naive_fraction(families[index], output.detach())
            tally = tallies.setdefault(index, [0, 0])
            tally[0] += hits
            tally[1] += total

        return hook

    handles = [model[i].register_forward_hook(hook_for(i)) for i in families]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector, sample_every=2)
    expected: dict[int, list[float]] = {}
    for i in range(4):
        tallies.clear()
        with probe.step():
            opt.zero_grad()
            # Two forwards in one step: the fractions cover both.
            loss = loss_of(model, i, scale=3.0) + loss_of(model, 100 + i, scale=1.0)
            loss.backward()
            opt.step()
        expected[i] = [tallies[j][0] / tallies[j][1] for j in families]
    for handle in handles:
        handle.remove()
    records = close_and_collect(probe, collector)

    hello = hello_of(collector)
    assert hello["layers"] == ["0", "2", "3", "5", "7"]
    assert hello["activations"] == [["1", "relu", 0], ["4", "tanh", 2], ["6", "sigmoid", 3]]
    assert sorted(records) == [0, 1, 2, 3]
    for i in (0, 2):
        fractions = records[i]["activations"]
        assert len(fractions) == 3
        # Every family is partly dead or saturated, so the comparison means something.
        assert all(0.0 < f < 1.0 for f in expected[i]), expected[i]
        for got, want in zip(fractions, expected[i], strict=True):
            assert abs(got - want) < 1e-6, (fractions, expected[i])
    for i in (1, 3):
        assert "activations" not in records[i]


def test_activation_hooks_exist_only_during_sampled_steps(collector: FrameCollector) -> None:
    model = activation_model()
    activations = [model[1], model[4], model[6]]
    others = [m for m in model.modules() if m not in activations]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector, sample_every=2)

    def hook_counts() -> list[int]:
        return [len(m._forward_hooks) for m in activations]

    assert hook_counts() == [0, 0, 0]
    for i in range(4):
        with probe.step():
            inside = hook_counts()
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
        assert inside == ([1, 1, 1] if i % 2 == 0 else [0, 0, 0]), (i, inside)
        assert hook_counts() == [0, 0, 0]
        assert all(len(m._forward_hooks) == 0 for m in others)

    # close() in the middle of a sampled step removes that step's hooks too.
    with probe.step():
        assert probe.step_index == 4
        assert hook_counts() == [1, 1, 1]
        probe.close()
        assert hook_counts() == [0, 0, 0]
    assert hook_counts() == [0, 0, 0]
    wait_for_bye(collector)


def test_dead_relu_has_fraction_one(collector: FrameCollector) -> None:
    torch.manual_seed(7)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)
    )
    with torch.no_grad():
        model[2].bias.fill_(-100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector, sample_every=1)
    for i in range(2):
        with probe.step():
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
    records = close_and_collect(probe, collector)
    assert hello_of(collector)["activations"] == [["1", "relu", 0], ["3", "relu", 1]]
    for i in (0, 1):
        alive, dead = records[i]["activations"]
        assert dead == 1.0
        assert 0.0 < alive < 1.0


# --- 4. gradients not cleared --------------------------------------------------------


def run_loop(
    collector: FrameCollector,
    clearing: str,
    *,
    steps: int = 5,
    clip: bool = False,
    **options: object,
) -> tuple[dict[int, Frame], Frame]:
    """Train ``steps`` steps with the given way of clearing gradients."""
    model = mlp(8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector, **options)
    for i in range(steps):
        with probe.step():
            if clearing == "none_before_forward":
                opt.zero_grad(set_to_none=True)
            elif clearing == "zero_before_forward":
                opt.zero_grad(set_to_none=False)
            loss = loss_of(model, i)
            if clearing == "none_after_forward":
                opt.zero_grad(set_to_none=True)
            elif clearing == "zero_after_forward":
                opt.zero_grad(set_to_none=False)
            loss.backward()
            if clip:
                probes.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
            probe.log(loss=loss)
    records = close_and_collect(probe, collector)
    assert sorted(records) == list(range(steps))
    return records, hello_of(collector)


def diagnose(hello: Frame, records: dict[int, Frame]) -> set[str]:
    diagnoser = Diagnoser(RunInfo.from_hello(hello))
    raised = set()
    for index in sorted(records):
        for change in diagnoser.observe(records[index]):
            if change.raised:
                raised.add(change.alert.kind)
    return raised


@pytest.mark.parametrize("clip", [False, True], ids=["plain", "probes-clip"])
def test_never_zeroed_grads_are_flagged_from_the_second_step(
    clip: bool, collector: FrameCollector
) -> None:
    # Checked around sampled steps: with every step sampled, every step after the first.
    records, hello = run_loop(collector, "never", clip=clip, sample_every=1)
    assert "grads_not_cleared" not in records[0]
    for i in range(1, 5):
        assert records[i].get("grads_not_cleared") is True, i
    assert hello["config"]["grad_accumulation"] is False
    assert "grad_not_cleared" in diagnose(hello, records)


def test_never_zeroed_grads_are_checked_at_every_update_not_only_sampled_ones(
    collector: FrameCollector,
) -> None:
    records, hello = run_loop(collector, "never", steps=13, sample_every=4)
    flagged = sorted(i for i, r in records.items() if r.get("grads_not_cleared"))
    assert flagged == list(range(1, 13))  # noted at each update, judged at the next
    assert "grad_not_cleared" in diagnose(hello, records)


@pytest.mark.parametrize(
    "clearing",
    ["none_before_forward", "zero_before_forward", "none_after_forward", "zero_after_forward"],
)
@pytest.mark.parametrize("clip", [False, True], ids=["plain", "probes-clip"])
def test_loops_that_clear_grads_are_never_flagged(
    clearing: str, clip: bool, collector: FrameCollector
) -> None:
    records, hello = run_loop(collector, clearing, clip=clip)
    for record in records.values():
        assert "grads_not_cleared" not in record
    assert "grad_not_cleared" not in diagnose(hello, records)


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("declared", [True, False])
def test_gradient_accumulation_loop_is_never_flagged(
    set_to_none: bool, declared: bool, collector: FrameCollector
) -> None:
    model = mlp(9)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector, grad_accumulation=declared)
    for i in range(8):
        with probe.step():
            loss = loss_of(model, i) / 2
            loss.backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
            probe.log(loss=loss)
    records = close_and_collect(probe, collector)
    assert sorted(records) == list(range(8))
    for record in records.values():
        assert "grads_not_cleared" not in record
    hello = hello_of(collector)
    assert hello["config"]["grad_accumulation"] is declared
    assert "grad_not_cleared" not in diagnose(hello, records)


def test_never_zeroed_loop_with_declared_accumulation(collector: FrameCollector) -> None:
    records, hello = run_loop(collector, "never", grad_accumulation=True)
    assert hello["config"]["grad_accumulation"] is True
    assert RunInfo.from_hello(hello).grad_accumulation is True
    for record in records.values():
        assert "grads_not_cleared" not in record
    # Even records that do claim uncleared gradients raise nothing for such a run.
    flagged = {i: {**r, "grads_not_cleared": True} for i, r in records.items()}
    assert "grad_not_cleared" not in diagnose(hello, flagged)


# --- 5. parameters without gradients -------------------------------------------------


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(10)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.unused = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_none_grad_params_name_the_unused_parameters(
    with_optimizer: bool, collector: FrameCollector
) -> None:
    model = WithUnused()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt if with_optimizer else None, collector)
    for i in range(3):
        with probe.step():
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
    records = close_and_collect(probe, collector)
    hello = hello_of(collector)
    assert hello["params"] == [
        "body.0.weight",
        "body.0.bias",
        "unused.weight",
        "unused.bias",
        "head.weight",
        "head.bias",
    ]
    assert hello["layers"] == ["body.0", "unused", "head"]
    assert sorted(records) == [0, 1, 2]
    for record in records.values():
        assert record["none_grad_params"] == [2, 3]
        assert [hello["params"][i] for i in record["none_grad_params"]] == [
            "unused.weight",
            "unused.bias",
        ]
        assert record["none_grads"] == 2
        assert record["grad_norms"][1] is None
        assert record["grad_norms"][0] > 0 and record["grad_norms"][2] > 0


def test_no_none_grad_params_when_every_parameter_has_a_gradient(
    collector: FrameCollector,
) -> None:
    records, _ = run_loop(collector, "none_before_forward", steps=2)
    for record in records.values():
        assert "none_grad_params" not in record
        assert record["none_grads"] == 0


# --- 6. modules that behave differently in eval mode ---------------------------------


def test_hello_counts_mode_sensitive_modules(collector: FrameCollector) -> None:
    model = nn.Sequential(
        nn.Linear(8, 16),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.2), nn.LayerNorm(16)),
        nn.Linear(16, 3),
    )
    probe = watch_unthinned(model, None, collector)
    probe.close()
    wait_for_bye(collector)
    assert hello_of(collector)["mode_sensitive_modules"] == 3


def test_hello_counts_no_mode_sensitive_modules_in_a_plain_mlp(
    collector: FrameCollector,
) -> None:
    probe = watch_unthinned(mlp(), None, collector)
    probe.close()
    wait_for_bye(collector)
    assert hello_of(collector)["mode_sensitive_modules"] == 0


def test_hello_counts_conv_batchnorm_and_dropout2d(collector: FrameCollector) -> None:
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.Dropout2d(0.1),
        nn.Flatten(),
        nn.AlphaDropout(0.1),
        nn.Linear(4 * 6 * 6, 3),
    )
    probe = watch_unthinned(model, None, collector)
    probe.close()
    wait_for_bye(collector)
    assert hello_of(collector)["mode_sensitive_modules"] == 3


# --- 7. close() removes every hook ---------------------------------------------------


def all_module_hooks(model: nn.Module) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, module in model.named_modules():
        for attr in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
        ):
            n = len(getattr(module, attr))
            if n:
                counts[f"{name or '(root)'}.{attr}"] = n
    return counts


def test_close_removes_every_hook(collector: FrameCollector) -> None:
    torch.manual_seed(11)
    model = nn.Sequential(
        nn.Linear(8, 16),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(16, 16),
        nn.Sigmoid(),
        nn.Linear(16, 3),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    probe = watch_unthinned(model, opt, collector, sample_every=2)
    assert len(opt._optimizer_step_pre_hooks) == 1  # gradients, then the update check
    assert len(opt._optimizer_step_post_hooks) == 1  # the update check's
    saw_hooks_during_run = False
    for i in range(6):
        with probe.step():
            saw_hooks_during_run |= bool(all_module_hooks(model))
            # the update measurement's only while a sampled step runs
            assert len(opt._optimizer_step_post_hooks) == (2 if i % 2 == 0 else 1)
            opt.zero_grad()
            loss = loss_of(model, i)
            loss.backward()
            probes.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            probe.log(loss=loss)
        with probe.evaluate():
            assert all_module_hooks(model)  # the evaluate block's pre hook
            model.eval()
            with torch.no_grad():
                probe.log(val_loss=loss_of(model, 50))
            model.train()
    assert saw_hooks_during_run
    # Leave a sampled step open, with activation hooks attached, when closing.
    with probe.step():
        assert probe.step_index == 6
        assert all_module_hooks(model)
        probe.close()
    with probe.evaluate():  # a closed probe adds nothing
        assert all_module_hooks(model) == {}
    assert len(opt._optimizer_step_pre_hooks) == 0
    assert len(opt._optimizer_step_post_hooks) == 0
    assert all_module_hooks(model) == {}
    assert len(torch.nn.modules.module._global_forward_hooks) == 0
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == 0
    wait_for_bye(collector)
    assert len(collector.kinds("eval")) == 6


# --- 8. a failing measurement never breaks training ---------------------------------


def boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("boom in a measurement")


FAILURES = [
    (probes.runtime.measure.measurer.StepMeasurer, "finish"),
    (probes.runtime.measure.stats.NormReducer, "norms"),
    (probes.runtime.measure.sampled.ActivationStats, "attach"),
    (probes.runtime.measure.sampled.UpdateNorms, "after_step"),
]


def train_twins(
    probe: probes.Probe | None, model: nn.Module, opt: torch.optim.Optimizer, steps: int
) -> list[float]:
    losses = []
    for i in range(steps):
        if probe is None:
            opt.zero_grad()
            loss = loss_of(model, i)
            loss.backward()
            opt.step()
        else:
            with probe.step():
                opt.zero_grad()
                loss = loss_of(model, i)
                loss.backward()
                opt.step()
                probe.log(loss=loss)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("owner, method", FAILURES, ids=[f"{o.__name__}.{m}" for o, m in FAILURES])
def test_failing_measurement_never_breaks_training(
    owner: type,
    method: str,
    collector: FrameCollector,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference = mlp(12)
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    expected = train_twins(None, reference, ref_opt, 6)

    monkeypatch.setattr(owner, method, boom)
    probe = watch_unthinned(model, opt, collector, sample_every=1)
    losses = train_twins(probe, model, opt, 6)
    probe.close()
    wait_for_bye(collector)

    # Training went on exactly as without the probe.
    assert losses == expected
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    lines = traintop_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert "boom in a measurement" in lines[0]
    errors = [f for f in collector.kinds("event") if f["name"] == "probe_error"]
    assert len(errors) == 1
    assert "boom in a measurement" in errors[0]["message"]
    assert all_module_hooks(model) == {}
    assert len(opt._optimizer_step_pre_hooks) == 0


@pytest.mark.parametrize("owner, method", FAILURES, ids=[f"{o.__name__}.{m}" for o, m in FAILURES])
def test_probe_switched_off_by_a_failure_leaves_no_activation_hooks(
    owner: type,
    method: str,
    collector: FrameCollector,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = mlp(13)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monkeypatch.setattr(owner, method, boom)
    probe = watch_unthinned(model, opt, collector, sample_every=1)
    train_twins(probe, model, opt, 1)
    lines = traintop_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "switched off" in lines[0], "the measurement did not fail"
    # Switched off: the rest of training must not pay for (or be seen by) its hooks.
    assert all_module_hooks(model) == {}
    with probe.step():
        assert all_module_hooks(model) == {}
    probe.close()
    wait_for_bye(collector)


def test_update_ratios_under_gradient_accumulation(collector: FrameCollector) -> None:
    """probe.step() per micro-batch, optimizer.step() every 4: a sampled step (every 10)
    with no update of its own has its ratios taken at the next optimizer.step()."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(
        model, optimizer, collector, sample_every=10, grad_accumulation=True
    ) as probe:
        for index in range(24):
            with probe.step():
                model(torch.randn(8, 8)).pow(2).mean().backward()
                if index % 4 == 3:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
    wait_for_bye(collector)
    with_ratios = {
        f["step"]: f["update_ratios"] for f in collector.kinds("step") if "update_ratios" in f
    }
    assert sorted(with_ratios) == [3, 11, 23]  # after the sampled steps 0, 10 and 20
    assert all(0 < r < 1 for ratios in with_ratios.values() for r in ratios)


class SequenceBlock(nn.Module):
    """A sequence model's feed-forward (batch-first): its ReLU's output is 4 x 128 x
    1,024, more than an activation's sample, with a known share of dead units."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(16, 1024)
        self.act = nn.ReLU()
        self.down = nn.Linear(1024, 1)
        with torch.no_grad():  # a quarter of the units dead at every position
            self.up.bias[:256] = -1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def test_activation_of_a_sequence_is_counted_on_a_sample_and_its_infinity_anywhere(
    collector: FrameCollector,
) -> None:
    model = SequenceBlock()
    seen: list[torch.Tensor] = []
    handle = model.act.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = watch_unthinned(model, opt, collector, sample_every=1)
    x = torch.randn(4, 128, 16)
    poisoned = x.clone()
    poisoned[3, 127, 0] = math.inf  # the very last position: outside the counted rows
    for inputs in (x, poisoned):
        with probe.step():
            opt.zero_grad()
            model(inputs).sum().backward()
            opt.step()
    handle.remove()
    records = close_and_collect(probe, collector)
    relu = [name for name, _, _ in hello_of(collector)["activations"]].index("act")
    naive = (seen[0] == 0).double().mean().item()
    assert probes.runtime.measure.sampled.activation_sample(seen[0]).numel() < seen[0].numel()
    assert 0.25 <= naive < 0.9
    assert abs(records[0]["activations"][relu] - naive) < 0.02
    assert math.isnan(records[1]["activations"][relu])
