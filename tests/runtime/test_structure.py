"""The training side's part of the diagnosis: structural checks when ``watch()`` is
called (positive and near miss), the per-step update check, layer inputs counted for
exact zeros (a ReLU written as ``F.relu``), and the sender's thinning of real
measurements (the peaks reach the monitor, the alerts are those of the unthinned run)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probes
from probes.kernel.diagnosis import Diagnoser, RunInfo
from probes.runtime.live_checks.structure import watch_time_alerts
from probes.runtime.measure.layers import map_layers
from tests.collector import FrameCollector, wait_for_bye, watch_unthinned


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)
    )


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 16, 5)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def alerts_of(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    return {a.kind: a for a in watch_time_alerts(model, optimizer, map_layers(model))}


# --- params_not_in_optimizer / optimizer_not_for_model ---------------------------------


def test_layers_left_out_of_the_optimizer_are_named() -> None:
    model = mlp()
    optimizer = torch.optim.Adam([*model[0].parameters(), *model[4].parameters()])
    alert = alerts_of(model, optimizer)["params_not_in_optimizer"]
    assert (alert.severity, alert.step, alert.subject, alert.layers) == ("warning", 0, "2", ("2",))
    assert alert.evidence["names"] == "2.weight, 2.bias"
    two_out = alerts_of(model, torch.optim.Adam(model[0].parameters()))
    alert = two_out["params_not_in_optimizer"]
    assert alert.layers == ("2", "4")
    assert (alert.evidence["layers_affected"], alert.evidence["range"]) == (2, "2..4")


def test_an_optimizer_with_every_parameter_and_more_is_fine() -> None:
    """Near miss: a learnable temperature of the loss beside the model's parameters."""
    model = mlp()
    temperature = nn.Parameter(torch.ones(()))
    optimizer = torch.optim.Adam([*model.parameters(), temperature])
    assert alerts_of(model, optimizer) == {}


def test_an_optimizer_built_for_a_copy_of_the_model() -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    copied = copy.deepcopy(model)
    found = alerts_of(copied, optimizer)
    assert list(found) == ["optimizer_not_for_model"]  # not also params_not_in_optimizer
    alert = found["optimizer_not_for_model"]
    assert alert.severity == "error"
    assert alert.evidence["model_params_held"] == 0 and alert.evidence["same_shapes"] is True
    assert alert.layers == ("0", "2", "4")


def test_a_foreign_tensor_of_another_shape_is_not_a_copy() -> None:
    """Near miss: part of the model and an unrelated tensor; the missing layers are
    reported as left out, not as a stale copy."""
    model = mlp()
    optimizer = torch.optim.SGD([*model[0].parameters(), nn.Parameter(torch.ones(5))], lr=0.1)
    assert list(alerts_of(model, optimizer)) == ["params_not_in_optimizer"]


# --- mostly_frozen ------------------------------------------------------------------------


def test_everything_frozen_but_batch_norm_is_a_warning() -> None:
    model = CNN()
    for name, param in model.named_parameters():
        param.requires_grad_("bn" in name)
    alert = alerts_of(model, torch.optim.Adam(model.parameters()))["mostly_frozen"]
    assert (alert.severity, alert.layers) == ("warning", ("bn",))
    assert alert.evidence["only_normalisation"] is True
    assert alert.evidence["frozen_fraction"] > 0.9


def test_linear_probing_is_reported_as_information() -> None:
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    )
    for param in [*model[0].parameters(), *model[2].parameters()]:
        param.requires_grad_(False)
    alert = alerts_of(model, torch.optim.Adam(model[4].parameters()))["mostly_frozen"]
    assert (alert.severity, alert.evidence["training"]) == ("info", "4")


def test_half_frozen_is_not_mostly_frozen() -> None:
    model = mlp()
    for param in model[2].parameters():
        param.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert alerts_of(model, torch.optim.Adam(trainable)) == {}


# --- through a probe: at step 0, then per step -------------------------------------------


def train(
    probe: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    x: torch.Tensor | None = None,
) -> None:
    torch.manual_seed(1)
    for _ in range(steps):
        batch = torch.randn(16, 8) if x is None else x
        with probe.step():
            optimizer.zero_grad()
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            probe.log(loss=loss)


def frames_of(probe: Any, collector: FrameCollector) -> list[dict[str, Any]]:
    probe.close()
    wait_for_bye(collector)
    return list(collector.frames)


def test_the_probe_sends_structural_alerts_at_step_0_and_untouched_layers_per_step(
    collector: FrameCollector,
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD([*model[0].parameters(), *model[2].parameters()], lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    train(probe, model, optimizer, 4)
    frames = frames_of(probe, collector)
    alerts = [f["alert"] for f in frames if f["kind"] == "alert"]
    assert [(a["kind"], a["step"], a["subject"]) for a in alerts] == [
        ("params_not_in_optimizer", 0, "4")
    ]
    hello = next(f for f in frames if f["kind"] == "hello")
    assert hello["config"]["update_check"] is True
    steps = [f for f in frames if f["kind"] == "step"]
    assert [s.get("not_stepped") for s in steps] == [[2]] * 4  # layer index 2: "4"


def test_no_untouched_layer_when_the_optimizer_holds_them_all(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    probe = watch_unthinned(model, optimizer, collector)
    train(probe, model, optimizer, 3)
    frames = frames_of(probe, collector)
    assert not [f for f in frames if f["kind"] == "alert"]
    assert all("not_stepped" not in f for f in frames if f["kind"] == "step")


# --- F.relu: the inputs of layers ------------------------------------------------------------


class FunctionalRelu(nn.Module):
    def __init__(self, dead: bool) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.out = nn.Linear(32, 1)
        if dead:
            with torch.no_grad():
                self.fc1.bias.fill_(-10.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


@pytest.mark.parametrize("dead", [True, False])
def test_a_dead_functional_relu_shows_in_the_next_layers_input(
    dead: bool, collector: FrameCollector
) -> None:
    model = FunctionalRelu(dead)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    probe = watch_unthinned(model, optimizer, collector, sample_every=2)
    train(probe, model, optimizer, 3)
    frames = frames_of(probe, collector)
    hello = next(f for f in frames if f["kind"] == "hello")
    names = [a[0] for a in hello["activations"]]
    assert names == ["fc1(input)", "fc2(input)", "out(input)"]
    assert [a[1:] for a in hello["activations"]] == [["input", None], ["input", 0], ["input", 1]]
    steps = {f["step"]: f for f in frames if f["kind"] == "step"}
    fc1_in, fc2_in, out_in = steps[2]["activations"]
    assert fc1_in is None  # the model's own input: data, not counted
    if dead:
        assert fc2_in == 1.0
    else:
        assert 0.2 < fc2_in < 0.8 and 0.2 < out_in < 0.8
    assert "activations" not in steps[1]  # sampled steps only
    diagnoser = Diagnoser(RunInfo.from_hello(hello))
    for record in [{**steps[n], "step": 20 * n} for n in sorted(steps)]:
        diagnoser.observe(record)
    assert ("dead_activations" in diagnoser.active) is dead


# --- the sender's thinning of real measurements ----------------------------------------------


def exploding_run(collector: FrameCollector, **options: Any) -> list[dict[str, Any]]:
    """(Without the automatic non-finite check: its one slower step would give the
    sender more wall time, so more records, than the thinning this counts.)"""
    options.setdefault("auto_anomaly", False)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    probe = probes.watch(model, optimizer, address=collector.address, **options)
    x = torch.randn(64, 8) * 3
    y = torch.randn(64, 1) * 50
    for _ in range(50):
        with probe.step():
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            probe.log(loss=loss)
    return frames_of(probe, collector)


def diagnosed(frames: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    diagnoser = Diagnoser(RunInfo.from_hello(next(f for f in frames if f["kind"] == "hello")))
    changes = [c for f in frames for c in diagnoser.observe(f)] + diagnoser.finish()
    return [(c.alert.kind, c.alert.subject, c.alert.step) for c in changes if c.raised]


def test_thinned_measurements_carry_their_peaks_and_raise_the_same_alerts(socket_path: str) -> None:
    every = FrameCollector(socket_path)
    try:
        unthinned = exploding_run(every, max_steps_per_s=1e9)
    finally:
        every.close()
    thinned_collector = FrameCollector(socket_path)
    try:
        thinned = exploding_run(thinned_collector, max_steps_per_s=5)
    finally:
        thinned_collector.close()
    merged = [f for f in thinned if f["kind"] == "step" and "span" in f]
    assert merged, "the run was not thinned"
    # Thinned by wall-clock time, so how many records depends on the machine's speed;
    # what does not: every step is in exactly one record, in order, none lost.
    spans = [f.get("span", [f["step"], f["step"]]) for f in thinned if f["kind"] == "step"]
    covered = [step for first, last in spans for step in range(first, last + 1)]
    assert covered == list(range(50))
    assert any(f["span"][1] > f["span"][0] for f in merged)  # a record stood for many
    for frame in merged:
        assert {"grad_norms_max", "scalars_max", "scalars_min", "duration"} <= set(frame)
    expected = diagnosed(unthinned)
    # SGD at 0.3 on targets of scale 50: updates as large as the weights at step 0 (the
    # rate far too high, the root cause: the explosion after it folds under it)
    assert expected and expected[0][0] == "update_ratio"
    got = diagnosed(thinned)
    assert [(k, s) for k, s, _ in got] == [(k, s) for k, s, _ in expected]
    assert all(0 <= a[2] - b[2] <= 2 for a, b in zip(got, expected, strict=True))
