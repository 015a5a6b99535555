"""The producer of a non-finite value named without a key press (issue 18, item 5): the
probe arms, once per incident, an observe-only check of the next step, and its report
(module, op, forward line) joins the incident. Tiny models, a few steps, in-process."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

import probes
from probes.kernel.diagnosis import Diagnoser, RunInfo
from probes.runtime.anomaly.auto_anomaly import REARM_AFTER_STEPS, AutoAnomaly
from tests.collector import FrameCollector
from tui.state import MonitorState


class MaskedSqrt(nn.Module):
    """sqrt where positive, else 0: finite forward, but the masked branch's backward is
    0 / (2 * sqrt(negative)) = NaN (torch.where's known trap)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return torch.where(h > 0, torch.sqrt(h), torch.zeros_like(h))


class Overflow(nn.Module):
    """Scales past float32's range: an inf born in the forward, in the stack's middle."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1e38 * 1e38


def masked_model(safe: bool = False) -> nn.Module:
    torch.manual_seed(0)
    middle: nn.Module = nn.Sequential(nn.Linear(4, 4), nn.ReLU()) if safe else MaskedSqrt()
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), middle, nn.Linear(4, 1))


def train(
    model: nn.Module, steps: int, probe: Any = None, pause: float = 0.06
) -> list[list[torch.Tensor]]:
    """``steps`` steps without an optimizer (NaN gradients leave the weights alone);
    each step's gradients, as the loop saw them."""
    torch.manual_seed(1)
    seen = []
    for _ in range(steps):
        x = torch.randn(8, 4)
        if probe is not None:
            probe.begin_step()
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        seen.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        if probe is not None:
            probe.log(loss=loss)
            probe.end_step()
        time.sleep(pause)  # the sender reads each step a little later
    return seen


def reports(collector: FrameCollector) -> list[dict[str, Any]]:
    return collector.kinds("anomaly")


def test_a_nan_born_in_backward_is_traced_to_its_module_op_and_line(
    collector: FrameCollector,
) -> None:
    model = masked_model()
    probe = probes.watch(model, address=collector.address, run="masked")
    train(model, 8, probe)
    probe.close()
    collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    found = reports(collector)
    assert len(found) == 1  # once per incident, though every step's gradients are NaN
    report = found[0]
    assert report["outcome"] == "non_finite_backward"
    assert report["backward_op"] == "SqrtBackward0"
    assert report["module_of_backward_op"] == "2"
    assert "torch.sqrt" in report["forward_traceback"][-1]["code"]
    assert report["auto"]["armed_by"] == 0 and report["step"] > 0
    assert "one step" in report["auto"]["cost"]
    assert report["update_skipped"] is False and report["paused"] is False
    # the report joins the non-finite incident, in the monitor
    state = MonitorState()
    for frame in collector.frames:
        state.apply(1, frame)
    (entry,) = [e for e in state.runs[found[0]["run"]].alerts if e.alert.kind == "non_finite"]
    assert entry.alert.subject == "grad_norm[2.lin]"  # backward order: nearest the sqrt
    assert entry.alert.evidence["producer"] == "2"
    assert entry.alert.evidence["producer_op"] == "SqrtBackward0"
    assert entry.alert.evidence["check_cost"] == "one step (automatic)"


def test_the_check_only_observes_the_training_is_unchanged(collector: FrameCollector) -> None:
    unwatched = train(masked_model(), 6, pause=0.0)
    model = masked_model()
    probe = probes.watch(model, address=collector.address)
    watched = train(model, 6, probe)
    probe.close()
    collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    assert len(reports(collector)) == 1  # the check ran (and let every backward finish)
    for theirs, ours in zip(unwatched, watched, strict=True):
        assert len(theirs) == len(ours)
        for a, b in zip(theirs, ours, strict=True):
            assert torch.equal(a.isnan(), b.isnan())
            assert torch.equal(a.nan_to_num(), b.nan_to_num())


def test_a_forward_overflow_names_the_first_module_whose_output_is_inf(
    collector: FrameCollector,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), Overflow(), nn.Linear(4, 1))
    probe = probes.watch(model, address=collector.address)
    train(model, 5, probe)
    probe.close()
    collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    (report,) = reports(collector)
    assert report["outcome"] == "non_finite_forward"
    assert report["first_non_finite"]["name"] == "2"


def test_near_miss_a_finite_run_arms_nothing(collector: FrameCollector) -> None:
    model = masked_model(safe=True)
    probe = probes.watch(model, address=collector.address)
    train(model, 6, probe)
    probe.close()
    collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    assert reports(collector) == []


def test_near_miss_auto_anomaly_off_checks_nothing(collector: FrameCollector) -> None:
    model = masked_model()
    probe = probes.watch(model, address=collector.address, auto_anomaly=False)
    train(model, 6, probe)
    probe.close()
    collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    assert reports(collector) == []
    assert collector.kinds("step")  # the run is watched all the same


def test_a_new_incident_arms_again_only_after_a_finite_stretch() -> None:
    auto = AutoAnomaly()
    auto.saw_non_finite(5)
    assert auto.take() == 5 and auto.take() is None
    for n in range(6, 60):  # NaN every step: the same incident
        auto.saw_non_finite(n)
    assert auto.take() is None
    auto.saw_non_finite(59 + REARM_AFTER_STEPS + 1)  # after a long finite stretch
    assert auto.take() == 59 + REARM_AFTER_STEPS + 1


def test_a_report_without_a_producer_or_without_an_incident_joins_nothing() -> None:
    diagnoser = Diagnoser(RunInfo(layers=("a",)))
    named = {"step": 3, "first_non_finite": {"name": "a"}, "backward_op": None}
    assert not diagnoser.note_anomaly(named)  # no non-finite incident yet
    diagnoser.observe({"kind": "step", "step": 2, "scalars": {"loss": float("nan")}})
    assert not diagnoser.note_anomaly({"step": 3, "outcome": "clean"})
    assert diagnoser.note_anomaly(named)
    assert diagnoser.active["non_finite"].evidence["producer"] == "a"


def test_on_a_sampled_step_the_first_module_out_of_range_is_named_at_once(
    collector: FrameCollector,
) -> None:
    """An overflow mid-stack on a sampled step: the activation hooks already attached
    name the first counted value that is non-finite (an activation's output, or a
    layer's input), and the layer before it, in the alert raised for that very step."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 4), nn.Tanh(), Overflow(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)
    )
    probe = probes.watch(model, address=collector.address, sample_every=1, auto_anomaly=False)
    train(model, 2, probe, pause=0.0)
    probe.close()
    collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    state = MonitorState()
    for frame in collector.frames:
        state.apply(1, frame)
    (run,) = state.runs.values()
    (entry,) = [e for e in run.alerts if e.alert.kind == "non_finite"]
    assert entry.alert.step == 0
    # the input of layer 3 (the output of the Overflow before it) is the first
    # out-of-range value the hooks counted, forward order; the last layer before it, 0
    assert entry.alert.evidence["first_non_finite_output"] == "3(input)"
    assert entry.alert.evidence["fed_by"] == "0"
    # the loss went bad downstream: the first failing layer is the subject, the loss
    # the field it showed in
    assert entry.alert.subject == "0" and entry.alert.evidence["field"] == "loss"


def test_near_miss_a_finite_sampled_step_names_no_module() -> None:
    diagnoser = Diagnoser(RunInfo(layers=("a",), activations=(("r", "relu", 0),)))
    nan = float("nan")
    diagnoser.observe({"kind": "step", "step": 0, "scalars": {"loss": nan}, "activations": [0.3]})
    assert "first_non_finite_output" not in diagnoser.active["non_finite"].evidence


class SkippedStep:
    """A pending measurement, as the sender reads it: an update skipped or not."""

    def __init__(self, optimizer_step: bool | None, loss: float) -> None:
        self.optimizer_step = optimizer_step
        self.loss = loss

    def merge_values(self) -> dict[str, Any]:
        return {"scalars": {"loss": self.loss}}


def test_gradscalers_skipped_updates_arm_no_check_but_a_non_finite_loss_does() -> None:
    """AMP's GradScaler skips updates with inf gradients while it finds its scale (at
    the start of every run): no check for those; a non-finite loss is never by design."""
    from probes.runtime.link.sender import _alarming

    assert not _alarming(SkippedStep(False, 0.5))  # type: ignore[arg-type]
    assert _alarming(SkippedStep(False, float("inf")))  # type: ignore[arg-type]
    assert _alarming(SkippedStep(True, 0.5))  # type: ignore[arg-type]
    assert _alarming(SkippedStep(None, 0.5))  # type: ignore[arg-type]
