"""Rung two's loss contract, live (issue 29 item 3): the loss calls of a run's first and
sampled training steps checked against the loss's contract, however the run is watched.

Each bug is a real one on an unmodified script (``tests/run_scripts/contract``), run
under ``traintop run --headless``: the kind named at the run's first steps, once, the
script's result bit for bit its own; the same script fixed raises nothing. In process:
``watch()`` alone and the step API; the healthy idioms that look alike (label
smoothing, soft targets, ``ignore_index``, ``log_softmax`` + NLL, a Gaussian NLL, KL
divergence, BCE on a sigmoid, losses of an evaluation); which calls are checked (the
first steps and the sampled ones, a run's own losses only); the tolerances on low
precision and many classes; and what the layer never does (change the loss, raise).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probes
from probes.checks.loss_contract import LIVE_FUNCTIONS, live_contract
from probes.runtime.evaluation import functional
from probes.runtime.live_checks import loss_contract_live
from probes.runtime.patches import seams
from probes.runtime.patches.patches import REGISTRY, Layer
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
SCRIPTS = os.path.join(ROOT, "tests", "run_scripts", "contract")
FIRST = loss_contract_live.FIRST_STEPS  # steps 0 .. FIRST - 1 are checked

BUGS = [
    ("char_softmax", "probabilities_into_logit_loss"),
    ("nll_scores", "logits_into_nll_loss"),
    ("bce_sigmoid", "bce_with_logits_given_probabilities"),
    ("mse_broadcast", "broadcast_in_loss"),
]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- traintop run, on unmodified scripts -----------------------------------------------------


def traintop_run(tmp_path: Any, script: str, *args: str) -> tuple[str, list[Frame]]:
    """``traintop run --headless --record LOG python script args``: its stdout (the
    monitor's lines and the script's), and the frames the monitor received."""
    log = os.path.join(tmp_path, f"{script}{''.join(args)}.ndjson")
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--record", log]
    command += [sys.executable, os.path.join(SCRIPTS, f"{script}.py"), *args]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "traintop: not attached" not in done.stderr
    with open(log, encoding="utf-8") as handle:
        frames = [json.loads(line) for line in handle if line.strip()]
    return done.stdout, frames


def untouched(script: str, fixed: bool) -> str:
    """The script's result line, trained here with no probe anywhere near."""
    module = runpy.run_path(os.path.join(SCRIPTS, f"{script}.py"), run_name="not_main")
    return str(module["train"](fixed=fixed))


def result_line(stdout: str) -> str:
    """The script's result line (a monitor's line may be written into it, unended)."""
    number = r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?"  # a float's repr
    [line] = re.findall(rf"result {number} {number}", stdout)
    return str(line)


def contract_alerts(frames: list[Frame]) -> list[dict[str, Any]]:
    """The alert frames the live contract sent (each names the loss function it saw,
    after the check report that names the check)."""
    alerts = [f for f in frames if f["kind"] == "alert" and "function" in f["alert"]["evidence"]]
    reports = {f["step"] for f in frames if f.get("check") == loss_contract_live.CHECK}
    assert {a["step"] for a in alerts} <= reports
    return alerts


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
@pytest.mark.parametrize(("script", "kind"), BUGS, ids=[script for script, _ in BUGS])
def test_traintop_run_names_the_broken_contract_at_the_first_steps(
    tmp_path: Any, script: str, kind: str
) -> None:
    stdout, frames = traintop_run(tmp_path, script)
    assert result_line(stdout) == untouched(script, fixed=False)  # the run's own numbers
    found = [a for a in contract_alerts(frames) if a["alert"]["kind"] == kind]
    assert len(found) == 1, frames  # once a run, not once a checked step
    assert found[0]["step"] < FIRST
    assert f"ALERT {found[0]['alert']['severity']} {kind} step={found[0]['step']}" in stdout
    assert kind in {a.kind for a in raised_alerts(frames)}


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
@pytest.mark.parametrize("script", [script for script, _ in BUGS])
def test_traintop_run_of_the_fixed_script_raises_nothing(tmp_path: Any, script: str) -> None:
    stdout, frames = traintop_run(tmp_path, script, "--fixed")
    assert result_line(stdout) == untouched(script, fixed=True)
    assert verdicts(raised_alerts(frames)) == []
    assert verdict_lines(stdout) == [], stdout


FRAMEWORKS = [
    ("hf_softmax", "probabilities_into_logit_loss", "transformers"),
    ("lightning_nll", "logits_into_nll_loss", "pytorch_lightning"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "kind", "framework"), FRAMEWORKS, ids=["hf", "lightning"])
def test_the_trainers_callbacks_name_the_broken_contract_and_not_the_fixed_one(
    tmp_path: Any, script: str, kind: str, framework: str
) -> None:
    pytest.importorskip(framework)
    stdout, frames = traintop_run(tmp_path, script)
    found = [a for a in contract_alerts(frames) if a["alert"]["kind"] == kind]
    assert len(found) == 1 and found[0]["step"] < FIRST, stdout
    stdout, frames = traintop_run(tmp_path, script, "--fixed")
    assert raised_alerts(frames) == [], stdout


# --- watch() alone, and the step API --------------------------------------------------------


def classifier(classes: int = 5, tail: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, classes)]
    return nn.Sequential(*layers, *([tail] if tail is not None else []))


def batch(step: int, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(32, 8, generator=g), torch.randint(0, classes, (32,), generator=g)


def kinds_sent(frames: list[Frame]) -> list[tuple[str, int]]:
    return [(f["alert"]["kind"], f["step"]) for f in frames if f["kind"] == "alert"]


def test_watch_alone_names_probabilities_into_cross_entropy(collector: FrameCollector) -> None:
    model = classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(model, optimizer, collector):  # no step API: steps inferred
        for step in range(25):
            x, y = batch(step)
            loss = nn.CrossEntropyLoss()(torch.softmax(model(x), dim=1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    wait_for_bye(collector)
    assert kinds_sent(collector.frames) == [("probabilities_into_logit_loss", 0)]
    [report] = [f for f in collector.frames if f.get("name") == "check_report"]
    assert report["check"] == loss_contract_live.CHECK
    assert probes.patched() == {}  # the layers went with the probe


def test_the_step_api_names_logits_into_nll_loss(collector: FrameCollector) -> None:
    model = classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with watch_unthinned(model, optimizer, collector) as probe:
        for step in range(25):
            with probe.step():
                x, y = batch(step)
                loss = F.nll_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
    wait_for_bye(collector)
    [(kind, step)] = kinds_sent(collector.frames)
    assert (kind, step) == ("logits_into_nll_loss", 0)
    [alert] = [f["alert"] for f in collector.frames if f["kind"] == "alert"]
    assert alert["evidence"]["function"] == "nll_loss"
    assert alert["evidence"]["logsumexp_off_0"] > 0.5


# --- healthy idioms stay silent ----------------------------------------------------------------


def _lm_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of a toy language model, from (B, 8) features."""
    return model(x).view(4, 8, 5)


def _smoothing(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y, label_smoothing=0.1)


def _mixup(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    soft = 0.7 * F.one_hot(y, 5).float() + 0.3 * F.one_hot(y.roll(1), 5).float()
    return F.cross_entropy(model(0.7 * x + 0.3 * x.roll(1, 0)), soft)


def _ignore_index(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = _lm_logits(model, x)
    labels = y.view(4, 8).clone()
    labels[:, :2] = -100  # a prompt's positions, ignored
    return F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)


def _sequence_dim(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(_lm_logits(model, x).transpose(1, 2), y.view(4, 8))  # (B, V, T)


def _log_softmax_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.NLLLoss()(F.log_softmax(model(x), dim=1), y)


def _gaussian_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)  # a mean and a log-variance: the loss goes negative as it should
    return F.gaussian_nll_loss(out[:, 0], x[:, 0] * 0.01, out[:, 1].exp())


def _kl_div(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    teacher = torch.softmax(x[:, :5], dim=1)
    return F.kl_div(F.log_softmax(model(x), dim=1), teacher, reduction="batchmean")


def _bce_on_sigmoid(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.BCELoss()(torch.sigmoid(model(x)), (y[:, None] == torch.arange(5)).float())


def _bce_with_logits(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(model(x), (y[:, None] == torch.arange(5)).float())


def _mse_same_shapes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), x[:, :5]) + F.smooth_l1_loss(model(x)[:, 0], x[:, 0])


def _logits_all_in_unit(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A GAN discriminator's young logits, biased above 0: all in [0, 1], no sigmoid."""
    logits = 0.5 + 0.01 * model(x)[:, :1]
    return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))


HEALTHY: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "label_smoothing": _smoothing,
    "mixup_soft_targets": _mixup,
    "ignore_index": _ignore_index,
    "class_dim_1_of_3": _sequence_dim,
    "log_softmax_nll": _log_softmax_nll,
    "gaussian_nll": _gaussian_nll,
    "kl_div": _kl_div,
    "bce_on_sigmoid": _bce_on_sigmoid,
    "bce_with_logits_on_logits": _bce_with_logits,
    "mse_same_shapes": _mse_same_shapes,
    "logits_all_in_unit": _logits_all_in_unit,
}


@pytest.mark.parametrize("idiom", list(HEALTHY))
def test_healthy_idioms_stay_silent(collector: FrameCollector, idiom: str) -> None:
    model = classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_of = HEALTHY[idiom]
    with watch_unthinned(model, optimizer, collector, sample_every=5) as probe:
        for step in range(12):  # steps 0, 1, 2, 5 and 10 checked
            with probe.step():
                x, y = batch(step)
                loss = loss_of(model, x, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
    wait_for_bye(collector)
    assert kinds_sent(collector.frames) == []


def test_an_evaluations_losses_are_not_training_checks(collector: FrameCollector) -> None:
    model = classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(model, optimizer, collector) as probe:
        for step in range(3):
            with probe.step():
                x, y = batch(step)
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                # inside the step: an accuracy-style "loss" on probabilities, no gradient
                with torch.no_grad():
                    F.nll_loss(torch.softmax(model(x), 1), y)
            with probe.evaluate():
                model.eval()
                probe.log(val_loss=F.cross_entropy(torch.softmax(model(x), 1), y).detach())
                model.train()
    wait_for_bye(collector)
    assert kinds_sent(collector.frames) == []


# --- which calls are checked ---------------------------------------------------------------


_step_now = [0]  # the step a test's loop is at, as the checks' record reads it


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The (function, loop step) of each call the live contract checked."""
    calls: list[tuple[str, int]] = []
    original = loss_contract_live.live_contract

    def counting(function: str, *args: Any, **kwargs: Any) -> Any:
        calls.append((function, _step_now[0]))
        return original(function, *args, **kwargs)

    monkeypatch.setattr(loss_contract_live, "live_contract", counting)
    return calls


def test_only_the_first_steps_and_sampled_steps_are_checked(
    collector: FrameCollector, checked: list[tuple[str, int]]
) -> None:
    model = classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(model, optimizer, collector, sample_every=10) as probe:
        for step in range(25):
            _step_now[0] = step
            with probe.step():
                x, y = batch(step)
                for _ in range(6):  # a loss per position: the first calls of a step only
                    loss = F.cross_entropy(torch.softmax(model(x), 1), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    wait_for_bye(collector)
    per_step = {s: sum(1 for _, at in checked if at == s) for _, s in checked}
    calls = loss_contract_live.CALLS_PER_STEP
    assert per_step == {0: calls, 1: calls, 2: calls, 10: calls, 20: calls}
    assert kinds_sent(collector.frames) == [("probabilities_into_logit_loss", 0)]  # once


def test_another_models_loss_is_not_this_runs(
    collector: FrameCollector, checked: list[tuple[str, int]]
) -> None:
    watched, other = classifier(), classifier()
    optimizer = torch.optim.SGD(watched.parameters(), lr=0.1)
    with watch_unthinned(watched, optimizer, collector) as probe:
        for step in range(3):
            with probe.step():
                x, y = batch(step)
                bad = F.cross_entropy(torch.softmax(other(x), 1), y)  # not this run's model
                loss = F.cross_entropy(watched(x), y) + 0 * bad.detach()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    wait_for_bye(collector)
    assert kinds_sent(collector.frames) == []
    assert len(checked) == 3  # the watched model's loss, once a step


@pytest.mark.parametrize("shown", [True, False], ids=["warning-shown", "warnings-ignored"])
def test_a_broadcast_is_said_once_whether_torchs_warning_shows_or_not(shown: bool) -> None:
    """torch warns of the sizes (``torch_warnings`` says it); a script that silences
    warnings gets the live check's alert instead: one alert either way."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sent: list[dict[str, Any]] = []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always" if shown else "ignore")
        probe = probes.watch(model, optimizer, address="unix:/nonexistent/traintop.sock")
        probe.send = sent.append  # type: ignore[method-assign]
        try:
            for _ in range(3):
                with probe.step():
                    loss = F.mse_loss(model(torch.randn(8, 3)), torch.randn(8))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        finally:
            probe.close()
    [alert] = [r["alert"] for r in sent if r.get("kind") == "alert"]
    assert alert["kind"] == "broadcast_in_loss"
    assert ("torch_warning" in alert["evidence"]) is shown  # whose alert it is
    assert ("function" in alert["evidence"]) is not shown


def test_check_batchs_own_loss_call_is_left_to_its_report(collector: FrameCollector) -> None:
    """``check_batch`` before the loop runs a forward (it begins an inferred step) and
    the loss: its report names the finding; the live check does not say it again."""
    model = classifier(tail=nn.Softmax(dim=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(model, optimizer, collector) as probe:
        report = probes.check_batch(model, batch(0), nn.CrossEntropyLoss(), probe=probe)
        assert report.kinds == ["probabilities_into_logit_loss"]
    wait_for_bye(collector)
    [alert] = [f["alert"] for f in collector.frames if f["kind"] == "alert"]
    assert alert["kind"] == "probabilities_into_logit_loss"
    assert "function" not in alert["evidence"]  # check_batch's, not the live check's


# --- what the layer never does -------------------------------------------------------------


def test_the_loss_returned_is_the_very_result_torch_returned(collector: FrameCollector) -> None:
    model = classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sentinel: list[torch.Tensor] = []

    def inner(proceed: Any, *args: Any, **kwargs: Any) -> Any:  # innermost: "torch's" result
        sentinel.append(proceed(*args, **kwargs))
        return sentinel[-1]

    seam = seams.functional("cross_entropy")
    assert seam is not None
    layer = REGISTRY.add(seam, Layer("test: torch's result", inner, order=99))
    try:
        with watch_unthinned(model, optimizer, collector) as probe, probe.step():
            x, y = batch(0)
            loss = F.cross_entropy(torch.softmax(model(x), 1), y)
            assert loss is sentinel[-1]  # checked (the alert below), returned as it came
            loss.backward()
    finally:
        REGISTRY.remove(seam, layer)
    wait_for_bye(collector)
    assert kinds_sent(collector.frames) == [("probabilities_into_logit_loss", 0)]


def test_a_check_that_fails_is_swallowed(
    collector: FrameCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a check that fails")

    monkeypatch.setattr(loss_contract_live, "live_contract", failing)
    model = classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(model, optimizer, collector) as probe:
        for step in range(4):
            with probe.step():
                x, y = batch(step)
                loss = F.cross_entropy(torch.softmax(model(x), 1), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
    wait_for_bye(collector)
    assert kinds_sent(collector.frames) == []
    assert not [f for f in collector.frames if f.get("name") == "probe_error"]
    assert len([f for f in collector.frames if f["kind"] == "step"]) == 4  # measured on


def test_the_functions_checked_have_stand_ins_from_torchs_import_under_traintop_run() -> None:
    assert set(LIVE_FUNCTIONS) <= set(functional.LOSSES)  # held by ``hold_losses``
    assert "gaussian_nll_loss" not in LIVE_FUNCTIONS and "kl_div" not in LIVE_FUNCTIONS


# --- the tolerances: rounding in the input's dtype, many classes ------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("classes", [2, 27, 5000])
def test_the_tolerances_follow_the_dtype_and_the_classes(dtype: torch.dtype, classes: int) -> None:
    g = torch.Generator().manual_seed(classes)
    logits = (torch.randn(64, classes, generator=g) * 3).to(dtype)
    y = torch.randint(0, classes, (64,), generator=g)
    probabilities = torch.softmax(logits, dim=1)
    log_probabilities = torch.log_softmax(logits, dim=1)

    def kinds(function: str, outputs: torch.Tensor) -> list[str]:
        result = getattr(F, function)(outputs.float(), y)
        return [f.kind for f in live_contract(function, outputs, y, result)]

    assert kinds("cross_entropy", probabilities) == ["probabilities_into_logit_loss"]
    assert kinds("cross_entropy", logits) == []
    assert kinds("cross_entropy", log_probabilities) == []  # log_softmax again: the same loss
    assert kinds("nll_loss", log_probabilities) == []
    assert kinds("nll_loss", logits) == ["logits_into_nll_loss"]
    assert kinds("nll_loss", probabilities) == ["logits_into_nll_loss"]


def test_a_sequence_models_class_dimension_is_read_in_its_place() -> None:
    logits = torch.randn(4, 7, 50)  # (B, C, T): cross_entropy's class dimension is 1
    y = torch.randint(0, 7, (4, 50))
    probabilities = torch.softmax(logits, dim=1)
    [finding] = live_contract("cross_entropy", probabilities, y, F.cross_entropy(logits, y))
    assert finding.kind == "probabilities_into_logit_loss"
    assert (finding.evidence["classes"], finding.evidence["rows_read"]) == (7, 16)
    over_time = torch.softmax(logits, dim=2)  # a softmax over the wrong dimension: logits
    assert live_contract("cross_entropy", over_time, y, F.cross_entropy(over_time, y)) == []


def test_a_target_that_broadcasts_to_the_outputs_own_shape_is_left_alone() -> None:
    outputs = torch.randn(32, 5, requires_grad=True)
    zero = torch.zeros(1)  # a constant target: every output against it, as meant
    with pytest.warns(UserWarning):  # (torch's own warning says what it says)
        result = F.l1_loss(outputs, zero)
    assert live_contract("l1_loss", outputs, zero, result) == []
    column = torch.randn(32, 1, requires_grad=True)
    [finding] = live_contract("l1_loss", column, torch.zeros(32), result)
    assert finding.kind == "broadcast_in_loss"
    assert finding.evidence["broadcast"] == [32, 32]


def test_negative_losses_are_evidence() -> None:
    scores = torch.randn(8, 3) + 5  # raw scores, well above 0: NLL goes negative
    y = torch.randint(0, 3, (8,))
    [finding] = live_contract("nll_loss", scores, y, F.nll_loss(scores, y))
    assert finding.evidence["negative_loss"] < 0
    logits = torch.randn(32, 1)
    signs = torch.randint(0, 2, (32, 1)).float() * 2 - 1  # labels in {-1, 1}, not {0, 1}
    result = F.binary_cross_entropy_with_logits(logits, signs)
    [finding] = live_contract("binary_cross_entropy_with_logits", logits, signs, result)
    assert finding.kind == "target_out_of_range"
    assert finding.evidence["min"] == -1.0
