"""Alerts end to end: the demo scenarios through the probe, the wire and the rules."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from demo.scenarios import BUILDERS
from demo.trainer import train
from tests.collector import FrameCollector
from tui.state import MonitorState


def run_scenario(name: str, collector: FrameCollector, steps: int | None = None) -> MonitorState:
    """Run a scenario in-process, every record kept, and diagnose it as the monitor does."""
    torch.manual_seed(0)
    setup = BUILDERS[name](False)
    train(
        setup,
        run=name,
        steps=steps,
        address=collector.address,
        max_steps_per_s=1e9,
        print_every=10**9,
    )
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    state = MonitorState()
    for frame in collector.frames:
        state.apply(0, frame)
    return state


def test_healthy_raises_no_alert_at_full_resolution(collector: FrameCollector) -> None:
    state = run_scenario("healthy", collector)
    [run] = state.runs.values()
    assert run.step_records == 1500  # every step diagnosed, none thinned away
    assert [entry.alert.line() for entry in run.alerts] == []


def test_exploding_names_a_layer_before_any_non_finite(collector: FrameCollector) -> None:
    state = run_scenario("exploding", collector, steps=60)
    [run] = state.runs.values()
    kinds = [entry.alert.kind for entry in run.alerts]
    assert "exploding_gradient" in kinds and "non_finite" in kinds
    exploding = run.alerts[kinds.index("exploding_gradient")].alert
    non_finite = run.alerts[kinds.index("non_finite")].alert
    assert kinds.index("exploding_gradient") < kinds.index("non_finite")
    assert exploding.step < non_finite.step
    assert exploding.subject in run.layers  # a layer, not just "the total"
    assert exploding.severity == "error"
    assert exploding.evidence["grad_norm"] > 0


def test_fixed_exploding_raises_no_alert(collector: FrameCollector) -> None:
    torch.manual_seed(0)
    train(
        BUILDERS["exploding"](True),
        run="fixed",
        address=collector.address,
        max_steps_per_s=1e9,
        print_every=10**9,
    )
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    state = MonitorState()
    for frame in collector.frames:
        state.apply(0, frame)
    [run] = state.runs.values()
    assert [entry.alert.line() for entry in run.alerts] == []


def headless_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tui.cli",
            "demo",
            *args,
            "--headless",
            "--delay",
            "0",
            "--summary-every",
            "100000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def alert_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("ALERT ")]


def test_headless_healthy_prints_no_alert() -> None:
    done = headless_demo("healthy", "--steps", "600")
    assert done.returncode == 0, done.stderr
    assert alert_lines(done.stdout) == []
    assert "alerts=0" in done.stdout


@pytest.mark.parametrize("fail_on", [None, "error"])
def test_headless_exploding_prints_alert_lines(fail_on: str | None) -> None:
    extra = ["--fail-on", fail_on] if fail_on else []
    done = headless_demo("exploding", "--steps", "60", *extra)
    lines = alert_lines(done.stdout)
    assert lines[0].startswith("ALERT error exploding_gradient step=")
    assert " subject=" in lines[0] and " grad_norm=" in lines[0]
    if fail_on:
        assert done.returncode == 3
        assert "failing: error alert exploding_gradient (--fail-on error)" in done.stdout
    else:
        assert done.returncode == 0, done.stderr
        assert any(line.startswith("ALERT error non_finite step=") for line in lines)


def test_fail_on_needs_headless(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--fail-on", "error"])
    assert exit_info.value.code == 2
    assert "--fail-on needs --headless" in capsys.readouterr().err
