"""Checks that follow the run (issue 18 item 7): the optimizer-wiring checks re-run when
the set of trainable parameters changes; an LR too low to change float32 weights; norm
layers recognised by what they are; a folded consequence never lowers ``--fail-on``.
Each with a positive case and a near miss."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch import nn

from probes.kernel.diagnosis import Thresholds
from tests.frames import hello, probe_alert, step
from tui.headless import HeadlessMonitor
from tui.server import Connection
from tui.state import MonitorState

# --- (c) norm layers by what they are --------------------------------------


class HandLayerNorm(nn.Module):
    """minGPT's way: a LayerNorm written by hand (with an optional bias)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Gain(nn.Module):
    """A hand-written RMS norm under a name that does not say so: a 1-D gain alone."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def frozen_but(last: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 32), last)
    for param in [*model[0].parameters(), *model[2].parameters()]:
        param.requires_grad_(False)
    return model


def mostly_frozen_of(model: nn.Module) -> Any:
    from probes.runtime.live_checks.structure import watch_time_alerts
    from probes.runtime.measure.layers import map_layers

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    [alert] = [a for a in watch_time_alerts(model, opt, map_layers(model))]
    assert alert.kind == "mostly_frozen"
    return alert


@pytest.mark.parametrize(
    "norm",
    [HandLayerNorm(32), Gain(32), *([nn.RMSNorm(32)] if hasattr(nn, "RMSNorm") else [])],
    ids=lambda m: type(m).__name__,
)
def test_everything_frozen_but_a_norm_is_a_warning_whatever_its_class(norm: nn.Module) -> None:
    alert = mostly_frozen_of(frozen_but(norm))
    assert alert.evidence["only_normalisation"] is True
    assert alert.severity == "warning"


@pytest.mark.parametrize("last", [nn.Linear(32, 32), nn.PReLU(32)], ids=["linear", "prelu"])
def test_everything_frozen_but_a_layer_that_is_no_norm_is_information(last: nn.Module) -> None:
    """Near miss: a head (linear probing), or torch's PReLU and its 1-D weight."""
    alert = mostly_frozen_of(frozen_but(last))
    assert alert.evidence["only_normalisation"] is False
    assert alert.severity == "info"


# --- (d) a folded consequence never lowers --fail-on -------------------------------------


def headless_verdict(fail_on: str, losses: list[float]) -> HeadlessMonitor:
    """A run whose probe said ``mostly_frozen`` (info) at step 0, then ``losses``."""
    state = MonitorState(Thresholds().with_overrides(flat_after_steps=20, smoothing_steps=5))
    monitor = HeadlessMonitor(out=io.StringIO(), summary_every=10**9, fail_on=fail_on, state=state)
    frames = [hello(), probe_alert("mostly_frozen", "info", 0)]
    frames += [step(i, loss=loss, seq=i + 2) for i, loss in enumerate(losses)]
    for frame in frames:
        monitor.frame_received(CONN, frame)
    return monitor


CONN = Connection(1, "test", None)  # a recorded run's connection: nothing sent back


def test_a_flat_loss_folded_under_an_info_cause_trips_fail_on_warning() -> None:
    monitor = headless_verdict("warning", [1.0] * 60)
    [run] = monitor.state.runs.values()
    [entry] = run.book.raised
    assert entry.alert.kind == "mostly_frozen" and entry.alert.severity == "info"
    assert any(f.startswith("flat_loss@") for f in entry.alert.folded)  # folded, not raised
    assert run.book.highest_severity() == "warning"
    assert monitor.failed_by is not None
    assert monitor.failed_by.alert.kind == "flat_loss"


def test_near_misses_a_learning_run_or_a_stricter_threshold_do_not_trip() -> None:
    learning = headless_verdict("warning", [1.0 / (1 + i) for i in range(60)])
    [run] = learning.state.runs.values()
    assert run.book.highest_severity() == "info" and learning.failed_by is None
    assert headless_verdict("error", [1.0] * 60).failed_by is None


# --- (b) a learning rate too low to change float32 weights ----------------------------------


def scheduled_run(collector: Any, *, step_every: int, steps: int = 120) -> dict[str, int]:
    """Adam at 1e-3 under StepLR(step_size=5, gamma=0.1), ``scheduler.step()`` every
    ``step_every`` batches (1: per batch, where it was meant per epoch)."""
    from tests.collector import wait_for_bye, watch_unthinned
    from tests.runtime.test_loop_shapes import loss_of, mlp, raised

    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.1)
    probe = watch_unthinned(model, opt, collector, sample_every=5)
    for i in range(steps):
        with probe.step():
            opt.zero_grad()
            loss = loss_of(model, i % 8)
            loss.backward()
            opt.step()
            probe.log(loss=loss)
        if (i + 1) % step_every == 0:
            scheduler.step()
    probe.close()
    wait_for_bye(collector)
    return raised(list(collector.frames))


def test_a_per_batch_step_lr_that_stops_the_weights_is_raised(collector: Any) -> None:
    kinds = scheduled_run(collector, step_every=1)  # 1e-13 by step 50
    assert "lr_too_low_to_update" in kinds, kinds
    assert kinds["lr_too_low_to_update"] <= 80


def test_the_same_schedule_per_epoch_raises_nothing(collector: Any) -> None:
    """Near miss: stepped every 40 batches the rate ends at 1e-6: a schedule's tail,
    updates still above float32's resolution."""
    assert scheduled_run(collector, step_every=40) == {}


def decayed_by_hand(collector: Any, *, decay: float, stop_at: int | None = None) -> Any:
    """Hand-written SGD (no optimizer, ``p.data.add_``: no version counter moves) at lr
    0.05 times ``decay`` per step; ``stop_at``: from that step the update is skipped
    for every layer. The alerts the monitor's rules raise."""
    from tests.collector import diagnose, wait_for_bye, watch_unthinned
    from tests.runtime.test_loop_shapes import loss_of, mlp

    model = mlp()
    probe = watch_unthinned(model, None, collector, sample_every=5)
    lr = 0.05
    for i in range(120):
        with probe.step():
            model.zero_grad()
            loss = loss_of(model, i % 8)
            loss.backward()
            if stop_at is None or i < stop_at:
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
            probe.log(loss=loss)
        lr *= decay
    probe.close()
    wait_for_bye(collector)
    return diagnose(list(collector.frames))[0]


def test_a_rate_decayed_to_nothing_by_hand_is_lr_too_low_not_updates_not_applied(
    collector: Any,
) -> None:
    """No optimizer, no rate to read: the weights moved on the first samples, then the
    update (lr 0.05 / 4 per step) rounds to nothing in float32."""
    alerts = decayed_by_hand(collector, decay=0.25)
    kinds = [a.kind for a in alerts]
    assert kinds == ["lr_too_low_to_update"], kinds
    assert alerts[0].evidence["updates"] == "by_hand"
    assert 0 <= alerts[0].evidence["last_moved_step"] < alerts[0].evidence["since_step"]
    assert alerts[0].step <= 40


def test_a_gentle_decay_by_hand_raises_nothing(collector: Any) -> None:
    """Near miss: lr x 0.98 per step ends near 4e-3 of where it began: updates shrink,
    and still change the weights."""
    assert decayed_by_hand(collector, decay=0.98) == []


def test_updates_never_applied_by_hand_stay_updates_not_applied(collector: Any) -> None:
    """A layer never moved from the first sample on: no rate decayed, the update is not
    applied (the rule of the rate defers only once the weights have moved)."""
    kinds = [a.kind for a in decayed_by_hand(collector, decay=1.0, stop_at=0)]
    assert "updates_not_applied" in kinds and "lr_too_low_to_update" not in kinds, kinds


# --- (a) the wiring checks follow the trainable set ------------------------------------------


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def fine_tune(
    collector: Any, *, add_to_optimizer: bool, steps: int = 30, unfreeze_at: int | None = 10
) -> list[Any]:
    """The backbone frozen, the optimizer built from what trains; unfrozen at step
    ``unfreeze_at`` (and added to the optimizer, or not). The probe's own alerts, in order."""
    from tests.collector import wait_for_bye, watch_unthinned
    from tests.runtime.test_loop_shapes import batch

    model = Backbone()
    model.backbone.requires_grad_(False)
    opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.01)
    probe = watch_unthinned(model, opt, collector, sample_every=5)
    for i in range(steps):
        if i == unfreeze_at:
            model.backbone.requires_grad_(True)
            if add_to_optimizer:
                opt.add_param_group({"params": list(model.backbone.parameters())})
        with probe.step():
            opt.zero_grad()
            x, y = batch(i)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    probe.close()
    wait_for_bye(collector)
    return [f for f in collector.frames if f["kind"] == "alert"]


def test_a_backbone_unfrozen_but_never_added_to_the_optimizer_is_raised(collector: Any) -> None:
    alerts = fine_tune(collector, add_to_optimizer=False)
    said = [(a["alert"]["kind"], a["step"]) for a in alerts]
    assert said == [("params_not_in_optimizer", 10)], said
    late = alerts[0]["alert"]
    assert late["layers"] == ["backbone.0", "backbone.2"]
    assert late["evidence"]["names"].startswith("backbone.0.weight")


def test_a_backbone_unfrozen_and_added_raises_nothing(collector: Any) -> None:
    """Near miss: unfrozen at step 10 and given to the optimizer (add_param_group): a
    recipe. Nothing is said, not even the note that most of the model was frozen (it is
    said only of a model that stays so for 100 steps)."""
    said = [(a["alert"]["kind"], a["step"]) for a in fine_tune(collector, add_to_optimizer=True)]
    assert said == []


def test_a_backbone_frozen_for_100_steps_gets_the_note(collector: Any) -> None:
    """Never unfrozen: the note (info) at the first sampled step 100 steps in, saying
    since when; nothing else."""
    alerts = fine_tune(collector, add_to_optimizer=False, unfreeze_at=None, steps=130)
    said = [(a["alert"]["kind"], a["alert"]["severity"], a["step"]) for a in alerts]
    assert said == [("mostly_frozen", "info", 100)], said
    assert alerts[0]["alert"]["evidence"]["frozen_since_step"] == 0
