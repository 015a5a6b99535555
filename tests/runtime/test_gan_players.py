"""A GAN whose G and D are watched by two probes (``watch()`` alone on each, as
``traintop run`` watches two models): both know they play a game.

D's gradient from G's loss (G's backward goes through D) is thrown away by D's next
``zero_grad()``: D's probe sees it (``discarded_grads``) and tells the probe whose
backward made it, G's. Neither player's loss is then judged as one that must fall
(before: ``flat_loss`` at step 200 on both). Two models trained on one shared loss,
each with its own optimizer, throw nothing away: no game."""

from __future__ import annotations

import torch
from torch import nn

from tests.collector import (
    Frame,
    FrameCollector,
    raised_alerts,
    verdicts,
    watch_unthinned,
)

STEPS = 260  # past flat_loss's 200-step window


def two_runs(frames: list[Frame]) -> dict[str, list[Frame]]:
    """Each run's frames, by run id."""
    runs: dict[str, list[Frame]] = {}
    for frame in frames:
        runs.setdefault(frame["run"], []).append(frame)
    assert len(runs) == 2, sorted(runs)
    return runs


def gan(collector: FrameCollector) -> list[Frame]:
    """The DCGAN tutorial's iteration on 2-D points, G and D each watched alone."""
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    net_d = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    probe_g = watch_unthinned(net_g, optimizer_g, collector)
    probe_d = watch_unthinned(net_d, optimizer_d, collector)
    for _ in range(STEPS):
        real = torch.randn(32, 2) * 0.5 + 2.0
        net_d.zero_grad()
        criterion(net_d(real).view(-1), torch.ones(32)).backward()
        fake = net_g(torch.randn(32, 4))
        criterion(net_d(fake.detach()).view(-1), torch.zeros(32)).backward()
        optimizer_d.step()
        net_g.zero_grad()
        criterion(net_d(fake).view(-1), torch.ones(32)).backward()
        optimizer_g.step()
    probe_g.close()
    probe_d.close()
    assert collector.wait_for(lambda fs: sum(f["kind"] == "bye" for f in fs) == 2)
    return list(collector.frames)


def shared_loss(collector: FrameCollector) -> list[Frame]:
    """An encoder and a decoder, each with its own optimizer, on one reconstruction loss."""
    torch.manual_seed(0)
    encoder, decoder = nn.Linear(8, 3), nn.Linear(3, 8)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (encoder, decoder)]
    models = (encoder, decoder)
    probes = [watch_unthinned(m, o, collector) for m, o in zip(models, optimizers, strict=True)]
    data = torch.randn(64, 8)
    for _ in range(30):
        for optimizer in optimizers:
            optimizer.zero_grad()
        nn.functional.mse_loss(decoder(encoder(data)), data).backward()
        for optimizer in optimizers:
            optimizer.step()
    for probe in probes:
        probe.close()
    assert collector.wait_for(lambda fs: sum(f["kind"] == "bye" for f in fs) == 2)
    return list(collector.frames)


def test_g_and_d_watched_apart_both_know_the_game(collector: FrameCollector) -> None:
    runs = two_runs(gan(collector))
    for frames in runs.values():
        steps = [f for f in frames if f["kind"] == "step"]
        assert len(steps) == STEPS
        assert all(s.get("discarded_grads") for s in steps[2:]), frames[0]["name"]
        assert verdicts(raised_alerts(frames)) == []


def test_near_miss_two_models_on_one_shared_loss_are_no_game(collector: FrameCollector) -> None:
    runs = two_runs(shared_loss(collector))
    for frames in runs.values():
        steps = [f for f in frames if f["kind"] == "step"]
        assert len(steps) == 30
        assert not any(s.get("discarded_grads") for s in steps)
