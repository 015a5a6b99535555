"""The probe on every step shape: closures, optimizer wrappers, the callback API
(``begin_step`` / ``gradients_final`` / ``end_step``), evaluation entry points, the
guard and the anomaly step when nothing catches for the probe, and its own cost."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn

import probes
from tests.collector import (
    Frame,
    FrameCollector,
    wait_connected,
    wait_for_bye,
    watch_unthinned,
)
from tui.headless import causes_line
from tui.state import MonitorState

REL_TOL = 1e-5


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,), generator=generator)


def layer_norms(model: nn.Module) -> list[float]:
    """Per Linear layer, the L2 norm of its gradients (float64, one layer at a time)."""
    return [
        torch.cat([p.grad.double().flatten() for p in m.parameters()]).norm().item()
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]


def steps_of(probe: probes.Probe, collector: FrameCollector) -> dict[int, Frame]:
    probe.close()
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    return {f["step"]: f for f in collector.kinds("step")}


def assert_norms(recorded: list[float | None], expected: list[float]) -> None:
    assert len(recorded) == len(expected)
    for got, want in zip(recorded, expected, strict=True):
        assert got is not None and abs(got - want) / want < REL_TOL, (recorded, expected)


# --- optimizer.step(closure) -----------------------------------------------------------


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.1),
        lambda params: torch.optim.LBFGS(params, lr=0.5, max_iter=4),
    ],
    ids=["sgd", "lbfgs"],
)
def test_closure_step_records_its_own_gradients(make_optimizer, collector: FrameCollector) -> None:
    model = mlp()
    optimizer = make_optimizer(model.parameters())
    probe = watch_unthinned(model, optimizer, collector)
    expected: list[list[float]] = []
    for i in range(4):
        x, y = batch(i)
        seen: list[list[float]] = []

        def closure(
            x: torch.Tensor = x, y: torch.Tensor = y, seen: list[list[float]] = seen
        ) -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            seen.append(layer_norms(model))  # the first call: the step's own gradients
            return loss

        with probe.step():
            optimizer.step(closure)
        expected.append(seen[0])
    records = steps_of(probe, collector)
    assert sorted(records) == [0, 1, 2, 3]
    for i in range(4):
        assert_norms(records[i]["grad_norms"], expected[i])
        assert "optimizer_step" not in records[i]  # it stepped


def lbfgs_step(model: nn.Module) -> int:
    """One bare LBFGS step on a fixed batch; how many times it called the closure."""
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = batch(0)
    calls = 0

    def closure() -> torch.Tensor:
        nonlocal calls
        calls += 1
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return calls


def test_closure_is_called_as_the_optimizer_calls_it(collector: FrameCollector) -> None:
    """The wrapped closure returns the loss and is called as often as without a probe
    (LBFGS's line search calls it again), with the same result."""
    reference, model = mlp(), mlp()
    bare_calls = lbfgs_step(reference)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    probe = watch_unthinned(model, optimizer, collector)
    x, y = batch(0)
    calls = 0

    def closure() -> torch.Tensor:
        nonlocal calls
        calls += 1
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with probe.step():
        returned = optimizer.step(closure)
    probe.close()
    assert isinstance(returned, torch.Tensor)  # LBFGS returns the closure's first loss
    assert calls == bare_calls > 1
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)


# --- optimizer wrappers and bad arguments ---------------------------------------------


class HoldsOptimizer(torch.optim.Optimizer):
    """Like accelerate's AcceleratedOptimizer: an Optimizer subclass whose __init__ never
    ran Optimizer's (no hook tables of its own), holding the real one."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)


class LightningLike:
    """Like Lightning's LightningOptimizer: not an Optimizer, holds one as _optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer


@pytest.mark.parametrize(
    "wrap",
    [HoldsOptimizer, LightningLike, lambda opt: HoldsOptimizer(HoldsOptimizer(opt))],
    ids=["accelerate-like", "lightning-like", "nested"],
)
def test_watch_takes_optimizer_wrappers(wrap, collector: FrameCollector) -> None:
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = wrap(inner)
    probe = watch_unthinned(model, wrapper, collector)
    assert probe.optimizer is inner
    x, y = batch(0)
    with probe.step():
        inner.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        expected = layer_norms(model)
        (wrapper if isinstance(wrapper, HoldsOptimizer) else inner).step()
    records = steps_of(probe, collector)
    assert_norms(records[0]["grad_norms"], expected)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda m: list(m.parameters()), "a list of Parameter"),
        (lambda m: m, "torch.nn.modules.container.Sequential"),
        (lambda m: "adam", "a builtins.str"),
    ],
)
def test_watch_refuses_what_is_not_an_optimizer(wrong, words: str) -> None:
    model = mlp()
    with pytest.raises(TypeError) as error:
        probes.watch(model, wrong(model))
    message = str(error.value)
    assert "torch.optim.Optimizer" in message and words in message
    assert "\n" not in message


# --- the callback API -------------------------------------------------------------------


def test_begin_and_end_step_span_micro_batches(collector: FrameCollector) -> None:
    """A framework's step: several backwards (accumulation), then clip and update, with
    the gradients read before the clip and the loss the sum the update used."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    expected, losses = [], []
    for step in range(3):
        probe.begin_step(step)
        total = None
        for micro in range(4):
            x, y = batch(10 * step + micro)
            loss = nn.functional.cross_entropy(model(x), y) / 4
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        expected.append(layer_norms(model))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        optimizer.step()
        optimizer.zero_grad()
        probe.log(loss=total)
        probe.end_step()
        losses.append(total.item())
    records = steps_of(probe, collector)
    assert sorted(records) == [0, 1, 2]
    for i in range(3):
        assert_norms(records[i]["grad_norms"], expected[i])
        assert records[i]["scalars"]["loss"] == pytest.approx(losses[i], rel=1e-6)
        assert records[i]["clip"]["max_norm"] == 0.01


def test_gradients_final_reads_before_the_framework_clears_them(collector: FrameCollector) -> None:
    model = mlp()
    probe = watch_unthinned(model, None, collector)  # no optimizer: nothing else tells
    probe.begin_step()
    x, y = batch(0)
    nn.functional.cross_entropy(model(x), y).backward()
    expected = layer_norms(model)
    probe.gradients_final()
    model.zero_grad(set_to_none=True)
    probe.end_step()
    records = steps_of(probe, collector)
    assert_norms(records[0]["grad_norms"], expected)
    assert records[0]["none_grads"] == 0


def test_step_records_the_probes_own_time(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    for i in range(3):
        with probe.step():
            x, y = batch(i)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    records = steps_of(probe, collector)
    for record in records.values():
        assert 0 < record["probe_time"] < record["duration"]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, first: int = 0) -> None:
    for i in range(first, first + steps):
        x, y = batch(i)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _unmeasured_then_measured(
    collector: FrameCollector, unmeasured: int, measured: int, **options: Any
) -> probes.Probe:
    """``unmeasured`` updates outside any probe step, then ``measured`` inside one each."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector, **options)
    _train(model, optimizer, unmeasured)
    for i in range(unmeasured, unmeasured + measured):
        with probe.step():
            _train(model, optimizer, 1, first=i)
    return probe


def test_updates_outside_any_probe_step_are_named_once(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    # forgot `with probe.step():`, with steps not inferred (by default they are: autostep)
    probe = _unmeasured_then_measured(collector, 10, 0, infer_steps=False)
    probe.close()
    wait_for_bye(collector)
    alerts = [f["alert"] for f in collector.kinds("alert")]
    assert [a["kind"] for a in alerts] == ["steps_not_measured"]
    assert alerts[0]["evidence"] == {"optimizer_steps": 3, "probe_steps": 0}
    assert "with probe.step()" in " ".join(alerts[0]["experiments"])
    assert capsys.readouterr().err.count("no probe step has begun") == 1


def test_an_lr_range_test_before_the_bracketed_loop_is_named_then_cleared(
    collector: FrameCollector,
) -> None:
    # Lightning's LR finder (or torch-lr-finder) steps the watched optimizer before the
    # measured loop: said while nothing is measured, over once a step is.
    probe = _unmeasured_then_measured(collector, 8, 4, infer_steps=False)
    probe.close()
    wait_for_bye(collector)
    state = MonitorState()
    events = [event for frame in list(collector.frames) for event in state.apply(1, frame)]
    [run] = state.runs.values()
    [entry] = run.alerts
    assert entry.alert.kind == "steps_not_measured"
    assert not entry.active and entry.cleared_at == 0
    assert [type(e).__name__ for e in events if "Alert" in type(e).__name__] == [
        "AlertRaised",
        "AlertCleared",
    ]
    assert entry.withdrawn and run.diagnoser.probe_alerts == {}  # not a root cause
    assert causes_line(run).endswith("in checklist order: ")


def test_a_warm_up_update_before_the_bracketed_loop_is_not_named(
    collector: FrameCollector,
) -> None:
    probe = _unmeasured_then_measured(collector, 1, 5)
    records = steps_of(probe, collector)
    assert sorted(records) == [0, 1, 2, 3, 4]
    assert not [f for f in collector.kinds("alert") if f["alert"]["kind"] == "steps_not_measured"]


# --- the guard and the anomaly step, with nothing to catch for the probe ---------------


def poisoned_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """What a framework does in a step whose loss is NaN: backward, clip, step, clear."""
    x, y = batch(seed)
    loss = nn.functional.cross_entropy(model(x), y) * float("nan")
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, torch.optim.AdamW])
def test_guard_skips_without_raising(optimizer_class, resuming_collector: FrameCollector) -> None:
    model = mlp()
    before = copy.deepcopy(model.state_dict())
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    probe = probes.watch(
        model, optimizer, address=resuming_collector.address, guard=True, max_steps_per_s=1e9
    )
    wait_connected(probe)
    probe.begin_step()
    poisoned_step(model, optimizer, 0)  # nothing raised, though no `with` block catches
    probe.end_step()
    assert probe.update_skipped
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed"
    probe.begin_step()  # paused here until the stand-in monitor resumes
    probe.end_step()
    probe.close()
    alerts = resuming_collector.kinds("alert")
    assert [a["alert"]["kind"] for a in alerts] == ["guard_skipped_update"]
    assert alerts[0]["alert"]["subject"] == "0"  # the first layer, in model order


def test_anomaly_step_catches_in_backward_and_reports(resuming_collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, optimizer, address=resuming_collector.address, max_steps_per_s=1e9)
    wait_connected(probe)
    before = copy.deepcopy(model.state_dict())
    probe.arm_anomaly()
    backward = torch.autograd.backward
    probe.begin_step()
    poisoned_step(model, optimizer, 0)  # anomaly mode's error never reaches this code
    probe.end_step()
    assert torch.autograd.backward is backward  # put back after the one step
    assert not torch.is_anomaly_enabled()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed"
    probe.begin_step()  # paused: resumed by the stand-in monitor
    probe.end_step()
    probe.close()
    reports = resuming_collector.kinds("anomaly")
    assert len(reports) == 1
    assert reports[0]["outcome"] == "non_finite_backward"
    assert reports[0]["backward_op"] == "MulBackward0"
    assert reports[0]["update_skipped"] and reports[0]["paused"]


def test_anomaly_step_with_raise_still_raises(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, optimizer, address=collector.address, on_anomaly="raise")
    probe.arm_anomaly()
    probe.begin_step()
    with pytest.raises(RuntimeError, match="returned nan values"):
        poisoned_step(model, optimizer, 0)
    probe.end_step(RuntimeError("Function 'MulBackward0' returned nan values"))
    probe.close()


# --- evaluation -------------------------------------------------------------------------


class EncoderHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_eval_checks_see_a_validation_that_skips_the_root_forward(
    collector: FrameCollector,
) -> None:
    model = EncoderHead()
    probe = watch_unthinned(model, None, collector)
    with probe.step():
        pass
    x, _ = batch(0)
    with probe.evaluate():  # training mode and gradients on: both mistakes
        features = model.encoder(x)  # a validation_step that calls a submodule
        probe.log(val_loss=features.square().mean())
    probe.begin_evaluation()
    model.eval()
    with torch.inference_mode():
        model.encoder(x)
        model.encoder(x)
    probe.end_evaluation(val_loss=0.5)
    probe.close()
    assert collector.wait_for(lambda frames: len([f for f in frames if f["kind"] == "eval"]) == 2)
    wrong, right = collector.kinds("eval")
    assert (wrong["forwards"], wrong["train_mode_forwards"], wrong["grad_forwards"]) == (1, 1, 1)
    assert (right["forwards"], right["train_mode_forwards"], right["grad_forwards"]) == (2, 0, 0)
    assert math.isfinite(wrong["scalars"]["val_loss"]) and right["scalars"]["val_loss"] == 0.5


def test_an_evaluation_is_tagged_with_the_steps_completed_before_it(
    collector: FrameCollector,
) -> None:
    """Before any step: 0; after step 0's update: 1 (a script's "step 1", a Trainer's
    global_step); after a step resumed at index 49: 50; inside an open step: its index."""
    model = mlp()
    probe = watch_unthinned(model, None, collector)
    with probe.evaluate():
        probe.log(val_loss=1.0)
    with probe.step():
        pass
    with probe.evaluate():
        probe.log(val_loss=2.0)
    with probe.step(49):
        pass
    with probe.evaluate():
        probe.log(val_loss=3.0)
    with probe.step(), probe.evaluate():
        probe.log(val_loss=4.0)
    probe.close()
    assert collector.wait_for(lambda frames: len([f for f in frames if f["kind"] == "eval"]) == 4)
    tags = [(f["step"], f["scalars"]["val_loss"]) for f in collector.kinds("eval")]
    assert tags == [(0, 1.0), (1, 2.0), (50, 3.0), (50, 4.0)]


def test_an_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(TypeError) as error:
        probes.watch(mlp(), sampel_every=5)
    message = str(error.value)
    assert "sampel_every" in message and "sample_every" in message and "\n" not in message
    with pytest.raises(ValueError, match="every and sample_every"):
        probes.watch(mlp(), every=0)
