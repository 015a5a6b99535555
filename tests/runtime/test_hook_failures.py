"""An error inside one of the probe's optimizer hooks switches the probe off and never
reaches ``optimizer.step()``: the hooks torch is iterating are made inert, not removed
under it (that raised "OrderedDict mutated during iteration" into training), and are
removed when the probe closes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probes
from probes.runtime.live_checks import structure


def boom(self: structure.UpdateCheck) -> None:
    raise ValueError("injected")


def train(probe: probes.Probe, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    torch.manual_seed(1)
    for _ in range(4):
        with probe.step():
            optimizer.zero_grad()
            model(torch.randn(4, 3)).pow(2).mean().backward()
            optimizer.step()


@pytest.mark.parametrize("hook", ["before", "after"])
def test_an_error_in_an_optimizer_hook_switches_the_probe_off_and_training_goes_on(
    hook: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks = optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks
    monkeypatch.setattr(structure.UpdateCheck, hook, boom)
    probe = probes.watch(model, optimizer, sample_every=1)
    train(probe, model, optimizer)  # raises nothing into the loop
    err = capsys.readouterr().err
    assert "probe switched off after an error: ValueError: injected" in err
    probe.close()
    assert [len(h) for h in hooks] == [0, 0]  # the inert ones went at close


def test_the_run_is_bit_for_bit_what_it_is_unwatched(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(watched: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        probe = probes.watch(model, optimizer, sample_every=1) if watched else None
        torch.manual_seed(1)
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).pow(2).mean().backward()
            optimizer.step()
        if probe is not None:
            probe.close()
        return [p.detach().clone() for p in model.parameters()]

    monkeypatch.setattr(structure.UpdateCheck, "after", boom)
    watched = run(True)
    assert all(torch.equal(a, b) for a, b in zip(watched, run(False), strict=True))
