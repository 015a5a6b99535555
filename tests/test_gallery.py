"""The demo gallery: every scenario raises the alert it teaches, and its fix raises none.

Each scenario runs as a user would run it (``traintop demo NAME --headless``), at full
speed; the runs go two at a time, since each spends most of its time starting torch.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from demo.catalog import SCENARIOS

# Shorter runs where the scenario's point is made early (the NaN ones pause each step);
# the fixed versions run their full length, so a fix is judged on a whole run.
STEPS = {"nan-forward": 80, "nan-backward": 60, "exploding": 60}


@dataclass(frozen=True)
class AlertLine:
    severity: str
    kind: str
    step: int
    subject: str


@dataclass(frozen=True)
class Outcome:
    status: int
    alerts: list[AlertLine]
    output: str


def parse_alerts(stdout: str) -> list[AlertLine]:
    alerts = []
    for line in stdout.splitlines():
        if not line.startswith("ALERT "):
            continue
        words = line.split()
        fields = dict(word.split("=", 1) for word in words[3:] if "=" in word)
        alerts.append(AlertLine(words[1], words[2], int(fields["step"]),
                                fields.get("subject", "")))
    return alerts


def run_demo(name: str, fixed: bool) -> Outcome:
    command = [sys.executable, "-m", "tui.cli", "demo", name, "--headless", "--delay", "0",
               "--summary-every", "1000000"]
    if name in STEPS and not fixed:
        command += ["--steps", str(STEPS[name])]
    if fixed:
        command.append("--fixed")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return Outcome(done.returncode, parse_alerts(done.stdout), done.stdout + done.stderr)


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, bool], Outcome]:
    runs = [(name, False) for name in SCENARIOS]
    runs += [(name, True) for name, info in SCENARIOS.items() if info.fixable]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda run: run_demo(*run), runs)
        return dict(zip(runs, results, strict=True))


@pytest.mark.parametrize("name", [n for n, info in SCENARIOS.items() if info.alerts])
def test_scenario_raises_the_alert_it_teaches(
        name: str, outcomes: dict[tuple[str, bool], Outcome]) -> None:
    info = SCENARIOS[name]
    outcome = outcomes[(name, False)]
    assert outcome.status == 0, outcome.output
    kinds = [alert.kind for alert in outcome.alerts]
    missing = [kind for kind in info.alerts if kind not in kinds]
    assert not missing, f"{name} did not raise {missing}:\n{outcome.output}"
    if info.subject:
        first = next(a for a in outcome.alerts if a.kind == info.alerts[0])
        assert first.subject == info.subject, outcome.output
    unexpected = [a for a in outcome.alerts if a.severity == "error"
                  and a.kind not in info.alerts]
    assert not unexpected, f"{name} raised unexpected errors {unexpected}"


@pytest.mark.parametrize("name", ["healthy"] + [n for n, i in SCENARIOS.items() if i.fixable])
def test_healthy_and_every_fix_raise_no_alert(
        name: str, outcomes: dict[tuple[str, bool], Outcome]) -> None:
    outcome = outcomes[(name, name != "healthy")]
    assert outcome.status == 0, outcome.output
    assert outcome.alerts == [], outcome.output
    assert "reason=finished" in outcome.output


def test_exploding_names_a_layer_before_the_first_non_finite(
        outcomes: dict[tuple[str, bool], Outcome]) -> None:
    alerts = outcomes[("exploding", False)].alerts
    kinds = [a.kind for a in alerts]
    exploding = alerts[kinds.index("exploding_gradient")]
    non_finite = alerts[kinds.index("non_finite")]
    assert kinds.index("exploding_gradient") < kinds.index("non_finite")
    assert exploding.step < non_finite.step
    assert exploding.subject in {"0", "2", "4"}
