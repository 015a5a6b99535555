"""AMP named as AMP (issue 18, item 3): gradients clipped (or stepped) while a
GradScaler still holds them scaled are ``grads_still_scaled``, naming the missing
``scaler.unscale_``, not ``exploding_gradient`` at 65,536 times the healthy norm.

Tiny in-process runs: the measurement itself is what is tested (torch's GradScaler on
the CPU, fp16 autocast)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from probes.kernel.diagnosis import Diagnoser, RunInfo
from tests.collector import Frame, FrameCollector, diagnose, wait_for_bye, watch_unthinned

#: torch's own methods (this module is imported before any probe opens).
TORCH_SCALE, TORCH_UPDATE = torch.amp.GradScaler.scale, torch.amp.GradScaler.update


def train(
    collector: FrameCollector,
    *,
    unscale: bool,
    clip: bool = True,
    scaler_step: bool = True,
    enabled: bool = True,
    steps: int = 8,
    lr: float = 1e-2,
) -> list[Frame]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", enabled=enabled)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with watch_unthinned(model, optimizer, collector) as probe:
        for _ in range(steps):
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = nn.functional.mse_loss(model(x).float(), y)
                scaler.scale(loss).backward()
                if unscale:
                    scaler.unscale_(optimizer)
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if scaler_step:
                    scaler.step(optimizer)
                    scaler.update()
                else:  # (update() without step() raises: such a loop has neither)
                    optimizer.step()  # the scaler's scale goes into the update
                probe.log(loss=loss)
    wait_for_bye(collector)
    return list(collector.frames)


def steps(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f["kind"] == "step"]


def test_clipping_before_unscale_is_grads_still_scaled_not_an_explosion(
    collector: FrameCollector,
) -> None:
    """Before: exploding_gradient at step 0 (total 7.0e4 = 65,536 x the healthy 1.07)."""
    frames = train(collector, unscale=False)
    first = steps(frames)[0]
    assert first["grads_scaled"] == 65536.0
    assert first["clip_active_steps"] == 1
    alerts, _ = diagnose(frames)
    assert [a.kind for a in alerts] == ["grads_still_scaled"]
    alert = alerts[0]
    assert (alert.step, alert.severity) == (0, "error")
    assert alert.evidence["missing"] == "scaler.unscale_(optimizer)"
    assert alert.evidence["loss_scale"] == 65536.0
    # the norms read were the scale times the real ones
    healthy = unscaled_first_norm()
    assert alert.evidence["unscaled_total"] == pytest.approx(healthy, rel=1e-2)
    assert first["grad_norm_total"] > 10_000 * healthy


def unscaled_first_norm() -> float:
    """The first step's total gradient norm of the same loop, without a scaler."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


def test_near_miss_unscale_before_the_clip_raises_nothing(collector: FrameCollector) -> None:
    frames = train(collector, unscale=True)
    assert all("grads_scaled" not in f for f in steps(frames))
    assert diagnose(frames)[0] == []


def test_stepping_the_optimizer_itself_on_scaled_gradients_is_named_too(
    collector: FrameCollector,
) -> None:
    """No clip, and optimizer.step() where scaler.step(optimizer) belongs: the update
    itself is 65,536 times too large; what follows folds under the missing unscale."""
    frames = train(collector, unscale=False, clip=False, scaler_step=False, steps=12)
    assert steps(frames)[0]["grads_scaled"] == 65536.0
    alerts, _ = diagnose(frames)
    assert alerts[0].kind == "grads_still_scaled"
    assert alerts[0].step == 0
    assert "exploding_gradient" not in [a.kind for a in alerts]


def test_near_miss_a_disabled_scaler_scales_nothing(collector: FrameCollector) -> None:
    frames = train(collector, unscale=False, enabled=False)
    assert all("grads_scaled" not in f for f in steps(frames))
    assert diagnose(frames)[0] == []


def test_the_probe_leaves_grad_scaler_as_it_found_it(collector: FrameCollector) -> None:
    scale, update = torch.amp.GradScaler.scale, torch.amp.GradScaler.update
    train(collector, unscale=True, steps=2)
    assert torch.amp.GradScaler.scale is scale is TORCH_SCALE
    assert torch.amp.GradScaler.update is update is TORCH_UPDATE


def test_the_rule_reads_the_record_and_exploding_gradient_leaves_it_alone() -> None:
    diagnoser = Diagnoser(RunInfo.from_hello({"layers": ["a", "b"]}))
    record = {
        "kind": "step",
        "step": 0,
        "scalars": {"loss": 1.0},
        "grad_norms": [60000.0, 30000.0],
        "grad_norm_total": 67082.0,
        "grads_scaled": 65536.0,
        "clip_steps": 1,
        "clip_active_steps": 1,
    }
    changes = diagnoser.observe(record)
    assert [(c.alert.kind, c.raised) for c in changes] == [("grads_still_scaled", True)]
    healthy = {**record, "step": 1, "grad_norms": [0.9, 0.5], "grad_norm_total": 1.03}
    del healthy["grads_scaled"]
    for n in range(1, 6):
        diagnoser.observe({**healthy, "step": n})
    assert diagnoser.active == {}  # cleared once the loop unscales


def _gan_under_one_scaler(
    collector: FrameCollector, *, step_api: bool, steps: int = 8, clip_before_unscale: bool
) -> list[Frame]:
    """DCGAN's loop under AMP: D's and G's optimizers, one GradScaler, D stepped before
    G; both watched as one run (``watch(model, [opt_d, opt_g])``)."""
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 1))
    model = nn.ModuleDict({"generator": generator, "discriminator": discriminator})
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    real, bce = torch.randn(16, 8), nn.functional.binary_cross_entropy_with_logits
    with watch_unthinned(model, [opt_d, opt_g], collector) as probe:
        for _ in range(steps):
            with probe.step() if step_api else contextlib.nullcontext():
                fake = generator(torch.randn(16, 4))
                opt_d.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    d_loss = bce(discriminator(real).float(), torch.ones(16, 1)) + bce(
                        discriminator(fake.detach()).float(), torch.zeros(16, 1)
                    )
                scaler.scale(d_loss).backward()
                if clip_before_unscale:  # the bug: D's gradients still carry the scale
                    torch.nn.utils.clip_grad_norm_(discriminator.parameters(), 1.0)
                scaler.step(opt_d)
                opt_g.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    g_loss = bce(discriminator(fake).float(), torch.ones(16, 1))
                scaler.scale(g_loss).backward()
                scaler.step(opt_g)
                scaler.update()
    wait_for_bye(collector)
    return list(collector.frames)


@pytest.mark.parametrize("step_api", [True, False], ids=["step api", "watch alone"])
def test_two_optimizers_under_one_scaler_are_not_grads_still_scaled(
    collector: FrameCollector, step_api: bool
) -> None:
    """Before: grads_still_scaled on every record (the set of two optimizers was never
    found in the scaler's per-optimizer states, so every read looked unscaled)."""
    frames = _gan_under_one_scaler(collector, step_api=step_api, clip_before_unscale=False)
    assert len(steps(frames)) == 8
    assert all("grads_scaled" not in f for f in steps(frames))
    assert "grads_still_scaled" not in [a.kind for a in diagnose(frames)[0]]


def test_two_optimizers_clipped_before_unscale_are_still_caught(
    collector: FrameCollector,
) -> None:
    """The near miss: D clipped before ``scaler.unscale_`` is still the bug."""
    frames = _gan_under_one_scaler(collector, step_api=True, clip_before_unscale=True)
    assert all(f.get("grads_scaled") == 65536.0 for f in steps(frames)[:1])
    assert "grads_still_scaled" in [a.kind for a in diagnose(frames)[0]]
