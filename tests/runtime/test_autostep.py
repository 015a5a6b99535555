"""``probes.watch(model, optimizer)`` alone measures a loop (``probes.runtime.steps.autostep``):
steps end at each ``optimizer.step()``, the loss is what ``backward()`` ran from; the
records are those the explicit step API gives on the same loop."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import probes
from probes.kernel.schema.spec import MEASURED_FIELDS
from tests.collector import (
    Frame,
    FrameCollector,
    raised_alerts,
    verdicts,
    wait_connected,
    wait_for_bye,
    watch_unthinned,
)

STEPS = 6


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,), generator=generator)


def loss_of(model: nn.Module, seed: int) -> torch.Tensor:
    x, y = batch(seed)
    return nn.functional.cross_entropy(model(x), y)


def frames_of(probe: probes.Probe, collector: FrameCollector) -> list[Frame]:
    probe.close()
    wait_for_bye(collector)
    return list(collector.frames)


def steps(frames: list[Frame]) -> dict[int, Frame]:
    return {f["step"]: f for f in frames if f["kind"] == "step"}


def plain_step(model: nn.Module, optimizer: torch.optim.Optimizer, i: int) -> torch.Tensor:
    optimizer.zero_grad()
    loss = loss_of(model, i)
    loss.backward()
    optimizer.step()
    return loss


def accumulating_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, i: int, micro: int = 3
) -> torch.Tensor:
    optimizer.zero_grad()
    total = None
    for m in range(micro):
        loss = loss_of(model, i * micro + m) / micro
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
    assert total is not None
    return total


def closure_step(model: nn.Module, optimizer: torch.optim.Optimizer, i: int) -> torch.Tensor:
    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of(model, i)
        loss.backward()
        return loss

    return optimizer.step(closure)


Step = Callable[[nn.Module, torch.optim.Optimizer, int], torch.Tensor]
LOOPS: dict[str, tuple[Step, Callable[[Any], torch.optim.Optimizer]]] = {
    "plain": (plain_step, lambda p: torch.optim.SGD(p, lr=0.1)),
    "accumulation_and_clip": (accumulating_step, lambda p: torch.optim.AdamW(p, lr=0.01)),
    "lbfgs_closure": (closure_step, lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=4)),
}


def run(collector: FrameCollector, loop: str, *, explicit: bool) -> list[Frame]:
    step, make = LOOPS[loop]
    model = mlp()
    optimizer = make(model.parameters())
    probe = watch_unthinned(model, optimizer, collector, sample_every=4)
    for i in range(STEPS):
        if explicit:
            with probe.step():
                probe.log(loss=step(model, optimizer, i))
        else:
            step(model, optimizer, i)
    return frames_of(probe, collector)


def comparable(record: Frame) -> dict[str, Any]:
    """What a step record says of the training (not of time or memory)."""
    return {
        key: value
        for key, value in record.items()
        if key not in MEASURED_FIELDS and key not in ("seq", "run", "dropped")
    }


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_watch_alone_gives_the_explicit_records(loop: str, socket_path: str) -> None:
    records = []
    for explicit in (True, False):
        collector = FrameCollector(f"{socket_path}.{int(explicit)}")
        try:
            records.append(steps(run(collector, loop, explicit=explicit)))
        finally:
            collector.close()
    explicit_steps, inferred_steps = records
    assert sorted(inferred_steps) == list(range(STEPS))
    assert sorted(explicit_steps) == list(range(STEPS))
    for index in range(STEPS):
        want, got = comparable(explicit_steps[index]), comparable(inferred_steps[index])
        assert math.isfinite(got["scalars"]["loss"])
        assert got == want, index  # losses bit for bit, per-layer norms, every field


def test_a_healthy_loop_raises_nothing_and_a_missing_zero_grad_is_named(
    socket_path: str,
) -> None:
    found = {}
    for clears in (True, False):
        collector = FrameCollector(f"{socket_path}.{int(clears)}")
        try:
            model = mlp()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            probe = watch_unthinned(model, optimizer, collector)
            for i in range(24):
                if clears:
                    optimizer.zero_grad()
                loss_of(model, i).backward()
                optimizer.step()
            found[clears] = {a.kind for a in raised_alerts(frames_of(probe, collector))}
        finally:
            collector.close()
    assert found[True] == set()
    assert "grad_not_cleared" in found[False]


def test_a_hand_written_update_with_no_optimizer_ends_each_step(
    collector: FrameCollector,
) -> None:
    model = mlp()
    probe = watch_unthinned(model, None, collector)
    losses = []
    for i in range(5):
        loss = loss_of(model, i)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad.zero_()
        losses.append(loss.item())
    records = steps(frames_of(probe, collector))
    assert sorted(records) == list(range(5))
    assert [records[i]["scalars"]["loss"] for i in range(5)] == losses


def test_a_logged_loss_wins_and_a_log_after_the_update_joins_its_step(
    collector: FrameCollector,
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    for i in range(4):
        plain_step(model, optimizer, i)
        probe.log(loss=float(i), accuracy=0.5)  # after optimizer.step(): that step's
    records = steps(frames_of(probe, collector))
    assert [records[i]["scalars"]["loss"] for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert all(records[i]["scalars"]["accuracy"] == 0.5 for i in range(4))


def test_a_warm_up_then_the_step_api_counts_from_zero(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    plain_step(model, optimizer, 99)  # inferred, held back, then dropped
    for i in range(3):
        with probe.step():
            probe.log(loss=plain_step(model, optimizer, i))
    records = steps(frames_of(probe, collector))
    assert sorted(records) == [0, 1, 2]


def test_a_grad_scaler_step_that_skips_the_update_still_ends_the_step(
    collector: FrameCollector,
) -> None:
    assert torch.amp.GradScaler("cpu").is_enabled()  # (torch>=2.3, as pyproject says)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    probe = watch_unthinned(model, optimizer, collector)
    losses = []
    for i in range(4):
        optimizer.zero_grad()
        loss = loss_of(model, i) * (float("inf") if i == 1 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # skipped at step 1 (inf gradients)
        scaler.update()
        losses.append(loss.item())
    records = steps(frames_of(probe, collector))
    assert sorted(records) == [0, 1, 2, 3]
    assert records[0]["scalars"]["loss"] == losses[0]  # unscaled: the loss computed
    # (the field is sent only when no update ran)
    assert records[1]["optimizer_step"] is False and "optimizer_step" not in records[2]
    assert math.isinf(records[1]["scalars"]["loss"])
    assert torch.autograd.backward.__module__ == "torch.autograd"  # put back at close


# --- control at the inferred boundary, after optimizer.step() ------------------------------


def poisoned_step(model: nn.Module, optimizer: torch.optim.Optimizer, i: int) -> None:
    optimizer.zero_grad()
    (loss_of(model, i) * float("nan")).backward()
    optimizer.step()


def test_the_guard_skips_and_pauses_a_loop_watched_alone(
    resuming_collector: FrameCollector,
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, resuming_collector, guard=True)
    wait_connected(probe)
    plain_step(model, optimizer, 0)
    before = copy.deepcopy(model.state_dict())
    poisoned_step(model, optimizer, 1)  # paused after its optimizer.step(), then resumed
    assert probe.update_skipped
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed"
    plain_step(model, optimizer, 2)
    assert not probe.update_skipped
    frames = frames_of(probe, resuming_collector)
    alerts = [f["alert"] for f in frames if f["kind"] == "alert"]
    assert [a["kind"] for a in alerts] == ["guard_skipped_update"]
    paused = [f for f in frames if f["kind"] == "event" and f["name"] == "paused"]
    assert [f["step"] for f in paused] == [1]
    assert sorted(steps(frames)) == [0, 1, 2]


def test_an_anomaly_step_runs_at_the_next_inferred_boundary(
    resuming_collector: FrameCollector,
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, resuming_collector)
    wait_connected(probe)
    plain_step(model, optimizer, 0)
    # Step 1 began in step 0's optimizer.step(): the anomaly step is the one after it.
    probe.arm_anomaly()
    plain_step(model, optimizer, 1)
    before = copy.deepcopy(model.state_dict())
    poisoned_step(model, optimizer, 2)  # caught in its backward: never raised here
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed"
    plain_step(model, optimizer, 3)  # paused at its boundary, resumed by the monitor
    frames = frames_of(probe, resuming_collector)
    reports = [f for f in frames if f["kind"] == "anomaly"]
    assert [r["step"] for r in reports] == [2]
    assert reports[0]["outcome"] == "non_finite_backward"
    assert reports[0]["backward_op"] == "MulBackward0"
    assert reports[0]["update_skipped"] and reports[0]["paused"]
    assert not torch.is_anomaly_enabled()


# --- evaluations, found ----------------------------------------------------------------------


class WithDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def evaluating_loop(collector: FrameCollector, *, eval_mode: bool) -> list[Frame]:
    """Train, and validate every 4 steps the way tutorials do (no traintop call)."""
    model = WithDropout()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    probe = watch_unthinned(model, optimizer, collector)
    criterion = nn.CrossEntropyLoss()
    for i in range(8):
        plain_step(model, optimizer, i)
        if i % 4 == 3:
            if eval_mode:
                model.eval()
            with torch.no_grad():
                for j in range(2):
                    x, y = batch(100 + j)
                    criterion(model(x), y)
            model.train()
    return frames_of(probe, collector)


def test_an_evaluation_and_its_loss_are_found(collector: FrameCollector) -> None:
    frames = evaluating_loop(collector, eval_mode=True)
    evals = [f for f in frames if f["kind"] == "eval"]
    assert [e["step"] for e in evals] == [4, 8]  # after 4 and 8 updates
    model = WithDropout()  # the same weights at step 4: retrain here without traintop
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(4):
        plain_step(model, optimizer, i)
    model.eval()
    with torch.no_grad():
        want = (
            sum(
                nn.functional.cross_entropy(model(batch(100 + j)[0]), batch(100 + j)[1])
                for j in range(2)
            )
            / 2
        )
    assert evals[0]["scalars"]["val_loss"] == pytest.approx(float(want), rel=1e-6)
    assert {a.kind for a in verdicts(raised_alerts(frames))} == set()
    assert nn.functional.cross_entropy.__module__ == "torch.nn.functional"  # put back


def test_an_evaluation_left_in_train_mode_is_named(socket_path: str) -> None:
    collector = FrameCollector(socket_path)
    try:
        frames = evaluating_loop(collector, eval_mode=False)
    finally:
        collector.close()
    assert "eval_in_train_mode" in {a.kind for a in raised_alerts(frames)}


def test_an_lr_experiment_applies_at_the_boundary_after_optimizer_step(
    collector: FrameCollector,
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    plain_step(model, optimizer, 0)  # step 1 begins inside this optimizer.step()
    probe._control.receive(
        {"v": 1, "kind": "command", "id": 1, "command": "lr_scale", "args": {"factor": 0.5}}
    )
    plain_step(model, optimizer, 1)  # at 0.1 still; the experiment starts after its update
    assert optimizer.param_groups[0]["lr"] == 0.05
    plain_step(model, optimizer, 2)
    frames = frames_of(probe, collector)
    records = steps(frames)
    assert [records[i]["lr"] for i in range(3)] == [[0.1], [0.1], [0.05]]
    [event] = [f for f in frames if f["kind"] == "event" and f["name"] == "lr_scale"]
    assert event["step"] == 2
