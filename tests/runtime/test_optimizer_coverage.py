"""A watched model is the module the training forward runs (issue 29 item 3, part A):
under ``traintop run`` an optimizer that holds only part of it (``Adadelta(model.fc
.parameters())``, the backbone learning gradients it never applies) is
``params_not_in_optimizer``, naming the first layer; linear probing, a backbone run under
``torch.no_grad()``, two optimizers of one model, an EMA copy, a GAN and forward-forward
raise nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from probes.attach import attach
from probes.attach.attach import plan_runs
from tests.collector import FrameCollector, verdict_lines, wait_for_bye, watch_unthinned
from tests.e2e.test_run import SCRIPTS, losses, result_lines, steps, traintop_run
from tests.run_scripts.coverage import near_misses
from tests.run_scripts.coverage.resnet_head import ResNetSmall, batch

Frame = dict[str, Any]


# --- which model each optimizer is watched with (``plan_runs``) -----------------------------------


@pytest.fixture
def seen() -> Iterator[Any]:
    """What ``traintop run``'s registration hooks would have seen of these modules and
    optimizers (the hooks themselves are not installed in the test process)."""
    made: list[torch.optim.Optimizer] = []

    def see(*things: Any) -> None:
        for thing in things:
            if isinstance(thing, torch.optim.Optimizer):
                attach._optimizers.add(thing)
                made.append(thing)
                continue
            for module in thing.modules():
                for name, param in module.named_parameters(recurse=False):
                    attach._parameter_registered(module, name, param)
                for name, child in module.named_children():
                    attach._module_registered(module, name, child)

    yield see
    for optimizer in made:
        attach._optimizers.discard(optimizer)


def test_a_head_optimizer_on_a_model_whose_forward_runs_waits_for_the_backward(seen: Any) -> None:
    model = ResNetSmall()
    optimizer = torch.optim.Adadelta(model.fc.parameters())
    seen(model, optimizer)
    assert attach.model_of(list(model.fc.parameters())) is model.fc  # its own part
    runs, wider = plan_runs([optimizer], model)
    assert runs == [] and wider is not None
    assert wider[0] is model and wider[1] == [(model.fc, [optimizer])]
    assert plan_runs([optimizer], None) == ([(model.fc, [optimizer])], None)  # at a step()


def test_linear_probing_is_the_heads_run(seen: Any) -> None:
    model = ResNetSmall()
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith("fc."))
    optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    seen(model, optimizer)
    assert plan_runs([optimizer], model) == ([(model.fc, [optimizer])], None)


def test_two_optimizers_of_one_model_are_one_run_of_it(seen: Any) -> None:
    model = near_misses.BodyAndHead()
    body = torch.optim.SGD(model.backbone.parameters(), lr=0.1)
    head = torch.optim.Adam(model.fc.parameters())
    seen(model, body, head)
    assert plan_runs([body, head], model) == ([(model, [body, head])], None)
    everything = torch.optim.SGD([p for n, p in model.named_parameters() if n != "fc.bias"])
    bias = torch.optim.SGD([model.fc.bias], lr=0.1)
    seen(everything, bias)
    # the bias's own model (fc) lies inside the other's (the whole): one run of it
    assert plan_runs([everything, bias], model) == ([(model, [everything, bias])], None)


def test_a_gan_forward_forward_and_an_ema_copy_keep_their_own_models(seen: Any) -> None:
    g, d = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), nn.Sequential(nn.Linear(2, 1))
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    seen(g, d, opt_g, opt_d)
    assert plan_runs([opt_g, opt_d], d) == ([(g, [opt_g]), (d, [opt_d])], None)
    layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
    per_layer = [torch.optim.Adam(layer.parameters()) for layer in layers]
    seen(layers, *per_layer)
    runs, wider = plan_runs(per_layer, layers[0])
    assert runs == [(layers[0], [per_layer[0]]), (layers[1], [per_layer[1]])] and wider is None
    model = ResNetSmall()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    averaged = torch.optim.swa_utils.AveragedModel(model)
    seen(model, averaged, optimizer)
    assert plan_runs([optimizer], model) == ([(model, [optimizer])], None)


# --- the alert, as watch() raises it for the whole model ------------------------------------------


def test_watching_the_whole_model_names_its_first_layer(collector: FrameCollector) -> None:
    torch.manual_seed(0)
    model = ResNetSmall()
    optimizer = torch.optim.Adadelta(model.fc.parameters())
    with watch_unthinned(model, optimizer, collector) as probe:
        for step in range(3):
            x, y = batch(step)
            with probe.step():
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
    wait_for_bye(collector)
    [alert] = [f["alert"] for f in collector.frames if f["kind"] == "alert"]
    assert (alert["kind"], alert["subject"]) == ("params_not_in_optimizer", "conv1")
    assert alert["layers"][-1] == "layer2.bn2" and "fc" not in alert["layers"]


# --- through ``traintop run``: unmodified scripts -------------------------------------------------


def run(tmp_path: Any, script: str, *args: str) -> tuple[Any, list[Frame]]:
    os.makedirs(os.path.join(tmp_path, "coverage"), exist_ok=True)  # (where its log goes)
    return traintop_run(tmp_path, os.path.join("coverage", script), *args)


def untouched(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    path = os.path.join(SCRIPTS, "coverage", f"{script}.py")
    done = subprocess.run(
        [sys.executable, path, *args], env=env, capture_output=True, text=True, timeout=300
    )
    return done.stdout.strip()


def alert_lines(stdout: str) -> list[str]:
    return verdict_lines(stdout)


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
def test_a_head_optimizer_under_traintop_run_names_the_backbone(tmp_path: Any) -> None:
    done, frames = run(tmp_path, "resnet_head")
    assert done.returncode == 0, done.stderr
    assert [f["name"] for f in frames if f["kind"] == "hello"] == [f"ResNetSmall-{pid(frames)}"]
    assert steps(frames) == list(range(40))  # step 0 too: it begins at the first backward
    assert None not in losses(frames).values()
    [line] = alert_lines(done.stdout)
    assert line.startswith("ALERT warning params_not_in_optimizer step=0 subject=conv1 "), line
    assert "range=conv1..layer2.bn2" in line
    causes = next(x for x in done.stdout.splitlines() if x.startswith("causes "))
    assert "params_not_in_optimizer@0" in causes  # what follows from it folds under it
    assert result_lines(done.stdout) == [untouched("resnet_head")]  # bit for bit


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--frozen"], ["--all"]], ids=["linear-probing", "all"])
def test_the_head_scripts_near_misses_raise_nothing(tmp_path: Any, args: list[str]) -> None:
    done, frames = run(tmp_path, "resnet_head", *args)
    assert done.returncode == 0, done.stderr
    assert alert_lines(done.stdout) == []
    [hello] = [f for f in frames if f["kind"] == "hello"]
    if args == ["--frozen"]:  # the head's run: nothing else of the model learns
        assert hello["layers"] == ["(root)"] and hello["name"].startswith("Linear-")
    else:
        assert hello["name"].startswith("ResNetSmall-") and len(hello["layers"]) == 11
    assert result_lines(done.stdout) == [untouched("resnet_head", *args)]


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
def test_partial_optimizers_that_are_right_raise_nothing_under_traintop_run(
    tmp_path: Any,
) -> None:
    done, frames = run(tmp_path, "near_misses")
    assert done.returncode == 0, done.stderr
    names = {f["run"]: f["name"].rsplit("-", 1)[0] for f in frames if f["kind"] == "hello"}
    assert sorted(names.values()) == sorted(
        [
            "ProbeHead",  # linear probing: the head's run
            "ApartHead",  # the backbone run apart under no_grad: the head's
            "InsideHead",  # its forward's no_grad: no gradient beyond the head's
            "BodyAndHead",  # two optimizers of one model: one run of it
            "EmaClassifier",  # the EMA copy is no run
            "Generator",
            "Discriminator",
            "FFLayer",
            "FFLayer",
        ]
    )
    raised: dict[str, set[str]] = {}
    for line in alert_lines(done.stdout):
        run_name = re.search(r"run=(\S+)", line)
        kind = line.split()[2]
        raised.setdefault(run_name.group(1).rsplit("-", 1)[0] if run_name else "?", set()).add(kind)
    # (the GAN's discriminator run alone sees the generator's backward add into its
    # gradient after its step, thrown away by its next zero_grad(): not uncleared)
    assert raised == {}, raised
    assert len(result_lines(done.stdout)) == 1  # (bit for bit: the head script's test)


def pid(frames: list[Frame]) -> int:
    return int(next(f for f in frames if f["kind"] == "hello")["pid"])
