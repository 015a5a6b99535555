"""The anomaly step and the guard, on the training side (no monitor needed)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import probes
from demo.scenarios import BUILDERS, Magnitude
from demo.trainer import train
from probes.runtime.probe import Probe
from tests.collector import FrameCollector, wait_connected


def anomaly_reports(collector: FrameCollector) -> list[dict]:
    return collector.kinds("anomaly")


def first_failure(reports: list[dict]) -> dict:
    return next(r for r in reports if r["outcome"] != "clean")


def run_under_anomaly(
    name: str, collector: FrameCollector, steps: int, monkeypatch: pytest.MonkeyPatch
) -> list[dict]:
    """Every step of a scenario under anomaly mode (as 999a would), the stand-in
    monitor resuming each pause."""
    torch.manual_seed(0)
    setup = BUILDERS[name](False)
    original = Probe.__init__

    def arming_init(self: Probe, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        self.arm_anomaly(10**6)

    monkeypatch.setattr(Probe, "__init__", arming_init)
    train(
        setup,
        run=name,
        steps=steps,
        address=collector.address,
        max_steps_per_s=1e9,
        print_every=10**9,
    )
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    return anomaly_reports(collector)


def test_nan_forward_report_names_the_module_where_the_inf_is_born(
    resuming_collector: FrameCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = run_under_anomaly("nan-forward", resuming_collector, 52, monkeypatch)
    assert [r["outcome"] for r in reports[:47]] == ["clean"] * 47
    report = first_failure(reports)
    assert report["step"] == 47
    assert report["first_non_finite"]["name"] == "log_complement"
    assert report["first_non_finite"]["type"] == "LogComplement"
    output = report["first_non_finite"]["output"]
    assert output["inf"] > 0 and report["first_non_finite"]["inputs"][0]["inf"] == 0
    assert report["first_non_finite"]["inputs"][0]["max"] == 1.0  # sigmoid rounded to 1
    # anomaly mode alone blames a backward op further down, not where the inf was born
    assert report["backward_op"] == "SigmoidBackward0"
    assert report["update_skipped"] and report["batch"] == 47


def test_nan_backward_report_names_the_op_and_its_module(
    resuming_collector: FrameCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = run_under_anomaly("nan-backward", resuming_collector, 6, monkeypatch)
    report = first_failure(reports)
    assert report["outcome"] == "non_finite_backward"
    assert report["backward_op"] == "PowBackward0"
    assert report["module_of_backward_op"] == "magnitude"
    assert report["first_non_finite"] is None  # the forward was finite throughout
    code = [frame["code"] for frame in report["forward_traceback"]]
    assert "return torch.sqrt((h**2).sum(dim=1, keepdim=True))" in code
    assert all("/torch/" not in frame["file"] for frame in report["forward_traceback"])


def magnitude_model() -> nn.Module:
    torch.manual_seed(3)
    # tanh, not ReLU: ReLU's backward would mask the NaN born below it (grad 0 at 0)
    return nn.Sequential(nn.Linear(4, 8, bias=False), nn.Tanh(), Magnitude(), nn.Linear(1, 1))


def batch(zero_row: bool) -> torch.Tensor:
    x = torch.randn(5, 4)
    if zero_row:
        x[2] = 0.0
    return x


def every_hook(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_anomaly_step_is_scoped_and_skips_the_update(resuming_collector: FrameCollector) -> None:
    model = magnitude_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, opt, address=resuming_collector.address)
    wait_connected(probe)  # the anomaly step pauses the run only with a monitor there
    hooks_inside: list[int] = []
    modes_inside: list[bool] = []
    for i, zero_row in enumerate([False, True, False]):
        probe.arm_anomaly() if i == 1 else None
        weights = [p.detach().clone() for p in model.parameters()]
        with probe.step():
            hooks_inside.append(every_hook(model))
            modes_inside.append(torch.is_anomaly_enabled())
            loss = model(batch(zero_row)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        unchanged = all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
        assert unchanged == (i == 1)  # the anomaly step's update was skipped
        assert not torch.is_anomaly_enabled()
        assert every_hook(model) == 1  # the phases' clock, on the model for the probe's life
        assert all(p.grad is None for p in model.parameters()) == (i == 1)
    probe.close()
    assert every_hook(model) == 0
    assert modes_inside == [False, True, False]
    # besides the clock's: step 0 is a sampled step: the Tanh's activation hook, the last
    # Linear's input hook and the model's (its own input is data, not counted); step 1
    # hooks every module
    assert hooks_inside == [1 + 3, 1 + len(list(model.modules())), 1]
    [report] = (
        anomaly_reports(resuming_collector)
        if resuming_collector.wait_for(
            lambda frames: bool([f for f in frames if f["kind"] == "anomaly"])
        )
        else [None]
    )
    assert report["step"] == 1 and report["backward_op"] == "PowBackward0"
    assert report["paused"] is True


def test_a_clean_anomaly_step_reports_clean_with_its_duration(
    resuming_collector: FrameCollector,
) -> None:
    model = magnitude_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with probes.watch(model, opt, address=resuming_collector.address) as probe:
        probe.arm_anomaly()
        weights = [p.detach().clone() for p in model.parameters()]
        with probe.step():
            loss = model(batch(False)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert not all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
        assert not probe.control.paused
    assert resuming_collector.wait_for(lambda frames: any(f["kind"] == "anomaly" for f in frames))
    [report] = anomaly_reports(resuming_collector)
    assert report["outcome"] == "clean" and report["duration"] > 0
    assert not report["update_skipped"] and report["backward_op"] is None


def test_on_anomaly_raise_reraises_into_the_loop(resuming_collector: FrameCollector) -> None:
    model = magnitude_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with probes.watch(model, opt, address=resuming_collector.address, on_anomaly="raise") as probe:
        probe.arm_anomaly()
        with pytest.raises(RuntimeError, match="PowBackward0"), probe.step():
            model(batch(True)).sum().backward()
        assert not torch.is_anomaly_enabled()
        assert not probe.control.paused


def test_guard_keeps_every_weight_finite_and_unchanged(resuming_collector: FrameCollector) -> None:
    model = magnitude_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    probe = probes.watch(model, opt, address=resuming_collector.address, guard=True)
    wait_connected(probe)  # the guard pauses the run only with a monitor there
    for i, zero_row in enumerate([False, False, True, False]):
        weights = [p.detach().clone() for p in model.parameters()]
        x = batch(zero_row)
        with probe.step():
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            assert any(not torch.isfinite(p.grad).all() for p in model.parameters()) == (i == 2)
            opt.step()
        after = list(model.parameters())
        assert all(torch.isfinite(p).all() for p in after)
        same = all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
        assert same == (i == 2), f"step {i}"
        assert probe.update_skipped == (i == 2)
    probe.close()
    assert resuming_collector.wait_for(lambda frames: any(f["kind"] == "alert" for f in frames))
    [alert_frame] = resuming_collector.kinds("alert")
    alert = alert_frame["alert"]
    assert alert["kind"] == "guard_skipped_update" and alert["severity"] == "error"
    assert alert["step"] == 2 and alert["subject"] == "0"  # the first layer's grads are NaN
    assert math.isnan(alert["evidence"]["first_value"])
    paused = [e for e in resuming_collector.kinds("event") if e["name"] == "paused"]
    assert paused and paused[0]["step"] == 2
