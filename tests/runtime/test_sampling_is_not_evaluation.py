"""A forward under ``no_grad`` that no loss judges is sampling, not an evaluation.

The DCGAN tutorial draws its fixed noise through G under ``no_grad`` with G left in
train mode (its BatchNorm), for its image grid; D's next training loss then came while
that "evaluation" was still open and was filed as G's validation loss, and G's train
mode was an ``eval_in_train_mode`` error. A real evaluation left in train mode (a loss
on its outputs) is still named."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from tests.collector import (
    Frame,
    FrameCollector,
    raised_alerts,
    verdict_lines,
    verdicts,
    wait_for_bye,
    watch_unthinned,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "run_scripts", "gan", "dcgan_tutorial.py")


def gan_loop(collector: FrameCollector, *, judge_samples: bool) -> list[Frame]:
    """The tutorial's iteration, G watched alone (no step API): every 10 iterations G
    samples the fixed noise under ``no_grad`` in train mode; ``judge_samples`` puts a
    loss on those samples (then it is an evaluation, in train mode: the bug)."""
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    net_d = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    fixed_noise = torch.randn(16, 4)
    probe = watch_unthinned(net_g, optimizer_g, collector)
    for i in range(30):
        real = torch.randn(32, 2) * 0.5 + 2.0
        net_d.zero_grad()
        err_real = criterion(net_d(real).view(-1), torch.ones(32))
        err_real.backward()
        fake = net_g(torch.randn(32, 4))
        err_fake = criterion(net_d(fake.detach()).view(-1), torch.zeros(32))
        err_fake.backward()
        optimizer_d.step()
        net_g.zero_grad()
        criterion(net_d(fake).view(-1), torch.ones(32)).backward()
        optimizer_g.step()
        if i % 10 == 0:
            with torch.no_grad():
                samples = net_g(fixed_noise)
                if judge_samples:
                    nn.functional.mse_loss(samples, torch.full_like(samples, 2.0))
    probe.close()
    wait_for_bye(collector)
    return list(collector.frames)


def test_sampling_the_fixed_noise_in_train_mode_is_no_evaluation(
    collector: FrameCollector,
) -> None:
    frames = gan_loop(collector, judge_samples=False)
    assert [f for f in frames if f["kind"] == "eval"] == []  # D's loss filed as G's: gone
    assert len([f for f in frames if f["kind"] == "step"]) == 30
    assert verdicts(raised_alerts(frames)) == []


def test_near_miss_samples_judged_by_a_loss_are_an_evaluation_in_train_mode(
    collector: FrameCollector,
) -> None:
    frames = gan_loop(collector, judge_samples=True)
    evals = [f for f in frames if f["kind"] == "eval"]
    assert [e["step"] for e in evals] == [1, 11, 21]
    # each evaluation's loss is the samples' own, not D's next training loss
    assert all(e["scalars"]["val_loss"] > 1.0 for e in evals), evals
    assert "eval_in_train_mode" in {a.kind for a in raised_alerts(frames)}


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
def test_the_dcgan_tutorial_under_traintop_run_raises_nothing(tmp_path: Any) -> None:
    """400 iterations, past the loss rules' 200-step windows: G and D, two runs, know
    they play a game (``tests/runtime/test_gan_players.py``) and sampling is no eval."""
    log = os.path.join(tmp_path, "dcgan.ndjson")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--record", log]
    done = subprocess.run(
        [*command, sys.executable, SCRIPT, "--iterations", "400"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    bare = subprocess.run(
        [sys.executable, SCRIPT, "--iterations", "400"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [result] = [line for line in bare.stdout.splitlines() if line.startswith("result ")]
    assert result in done.stdout  # the run's own numbers, untouched
    assert verdict_lines(done.stdout) == [], done.stdout
    with open(log, encoding="utf-8") as handle:
        kinds = [line for line in handle if '"kind":"eval"' in line.replace(" ", "")]
    assert kinds == []
