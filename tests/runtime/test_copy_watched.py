"""A watched model can be copied and saved as a user's loop does (``copy.deepcopy`` for
an EMA twin or a tiny-batch test, ``torch.save(model)`` of the whole module), at any
point of a run: the probe's hooks travel as inert stand-ins, never as the probe."""

from __future__ import annotations

import copy
import io

import torch
from torch import nn

import probes
from tests.collector import FrameCollector, wait_for_bye


def small() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()


def test_a_model_watched_alone_is_copied_and_saved(collector: FrameCollector) -> None:
    model = small()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = probes.watch(model, opt, address=collector.address, max_steps_per_s=1e9)
    for _ in range(3):
        train_step(model, opt)
    twin = copy.deepcopy(model)  # an EMA twin, mid-run
    buffer = io.BytesIO()
    torch.save(model, buffer)  # the whole module, hooks and all
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    twin.eval()
    with torch.no_grad():  # the twin's evaluation is not the watched model's
        twin(torch.randn(2, 4))
        loaded(torch.randn(2, 4))
    for _ in range(3):
        train_step(model, opt)
    probe.close()
    wait_for_bye(collector)
    assert collector.kinds("eval") == []  # no evaluation opened by the copies' forwards
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == list(range(6))
    for p, q in zip(twin.parameters(), loaded.parameters(), strict=True):
        assert torch.equal(p, q)
