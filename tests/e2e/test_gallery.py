"""The demo gallery: every scenario raises the alert it teaches, and its fix raises none.

Each scenario runs as a user would run it, at full speed: the healthy one as
``traintop demo healthy --headless``, the others as ``traintop --headless`` in front of
``python -m demo NAME``, whose trainers fork from one warm interpreter (``warm_demo``:
torch is imported once, not thirty times). The runs go two at a time (one at a time
under pytest-xdist, whose other worker keeps the second core busy: a demo that shares
its core measures its probe as slower than it is). All runs are queued when the module
starts, in the order the tests ask for them, and each test waits only for its own run:
a slow machine stretches the whole, not one test, and a run that hangs fails its own
test with its own output. Under pytest-xdist the module's tests stay on one worker
(``--dist loadgroup``), so the runs are queued once.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo.catalog import SCENARIOS
from tests.warm_demo import WarmTrainers

# The slow tier: every scenario and its fix through the command line is 70 s of work,
# a third of the default tier's. The default tier keeps the demo's own end-to-end runs
# (``test_demo_launcher.py``, the terminal's and the keyboard's tests).
pytestmark = [pytest.mark.xdist_group("gallery"), pytest.mark.slow]

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
    output: str  # stdout, then stderr
    lines: list[str]  # stdout's


def parse_alerts(stdout: str) -> list[AlertLine]:
    alerts = []
    for line in stdout.splitlines():
        if not line.startswith("ALERT "):
            continue
        words = shlex.split(line)  # (headless lines split as a shell splits words)
        fields = dict(word.split("=", 1) for word in words[3:] if "=" in word)
        alerts.append(AlertLine(words[1], words[2], int(fields["step"]), fields.get("subject", "")))
    return alerts


RUN_TIMEOUT_S = 90  # one run; the pytest timeout per test (120 s) stays above it


def demo_args(name: str, fixed: bool) -> list[str]:
    """The trainer's arguments: full speed, the scenario's length unless ``STEPS``."""
    args = [name, "--delay", "0"]
    if name in STEPS and not fixed:
        args += ["--steps", str(STEPS[name])]
    if fixed:
        args.append("--fixed")
    return args


def run_warm(trainers: WarmTrainers, name: str, fixed: bool) -> Outcome:
    run = trainers.run(
        demo_args(name, fixed), ["--summary-every", "1000000"], timeout_s=RUN_TIMEOUT_S
    )
    status = run.monitor_status
    if status == 0 and run.trainer_status != 0:  # as ``traintop demo`` says it
        status = 1
    output = run.output + f"\n(the trainer's status: {run.trainer_status})"
    return Outcome(status, parse_alerts(run.stdout), output, run.stdout.splitlines())


def run_demo(name: str, fixed: bool, record: Path | None = None) -> Outcome:
    command = [sys.executable, "-m", "tui.cli", "demo", *demo_args(name, fixed)]
    command += ["--headless", "--summary-every", "1000000"]
    if record is not None:
        command += ["--record", str(record)]
    # Its own session, so that a run which hangs is killed with its trainer.
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            return Outcome(
                -1,
                parse_alerts(stdout),
                f"timed out after {RUN_TIMEOUT_S} s; output so far:\n{stdout}{stderr}",
                stdout.splitlines(),
            )
    return Outcome(process.returncode, parse_alerts(stdout), stdout + stderr, stdout.splitlines())


ALERTING = [name for name, info in SCENARIOS.items() if info.alerts]
CLEAN = ["healthy"] + [name for name, info in SCENARIOS.items() if info.fixable]


# Runs at once: two, or one beside another pytest-xdist worker.
AT_ONCE = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


class Gallery:
    """Every run of the module, started ``AT_ONCE`` at a time in the order the tests
    read them; the healthy run is recorded (``--record``) to ``healthy_log``."""

    def __init__(self, folder: Path) -> None:
        self.healthy_log = folder / "healthy.ndjson"
        self._pool = ThreadPoolExecutor(max_workers=AT_ONCE)
        self._trainers = WarmTrainers()
        runs = [(name, False) for name in ALERTING]
        runs += [(name, name != "healthy") for name in CLEAN]
        self._runs: dict[tuple[str, bool], Future[Outcome]] = {
            (name, fixed): (
                self._pool.submit(run_demo, name, fixed, self.healthy_log)
                if name == "healthy"
                else self._pool.submit(run_warm, self._trainers, name, fixed)
            )
            for name, fixed in runs
        }

    def outcome(self, name: str, fixed: bool) -> Outcome:
        return self._runs[(name, fixed)].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._trainers.close()


@pytest.fixture(scope="module")
def gallery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gallery]:
    runs = Gallery(tmp_path_factory.mktemp("gallery"))
    yield runs
    runs.close()


@pytest.mark.parametrize("name", ALERTING)
def test_scenario_raises_the_alert_it_teaches(name: str, gallery: Gallery) -> None:
    info = SCENARIOS[name]
    outcome = gallery.outcome(name, fixed=False)
    assert outcome.status == 0, outcome.output
    kinds = [alert.kind for alert in outcome.alerts]
    missing = [kind for kind in info.alerts if kind not in kinds]
    if info.either:  # one root cause, seen either way: one of them, not both
        assert len(missing) == len(info.alerts) - 1, f"{name}: {kinds}\n{outcome.output}"
    else:
        assert not missing, f"{name} did not raise {missing}:\n{outcome.output}"
    if info.subject:
        first = next(a for a in outcome.alerts if a.kind == info.alerts[0])
        assert first.subject == info.subject, outcome.output
    unexpected = [a for a in outcome.alerts if a.severity == "error" and a.kind not in info.alerts]
    assert not unexpected, f"{name} raised unexpected errors {unexpected}"


@pytest.mark.parametrize("name", CLEAN)
def test_healthy_and_every_fix_raise_no_alert(name: str, gallery: Gallery) -> None:
    outcome = gallery.outcome(name, fixed=name != "healthy")
    assert outcome.status == 0, outcome.output
    # no warning or error; an info note may say the probe's own cost on a busy machine
    assert [a for a in outcome.alerts if a.severity != "info"] == [], outcome.output
    assert "reason=finished" in outcome.output


def test_exploding_names_a_layer_before_the_first_non_finite(gallery: Gallery) -> None:
    """The root cause first, in time: the non-finite values that follow the explosion
    fold under it (one incident, listed first among the run's causes)."""
    outcome = gallery.outcome("exploding", fixed=False)
    kinds = [a.kind for a in outcome.alerts]
    exploding = outcome.alerts[kinds.index("exploding_gradient")]
    assert "non_finite" not in kinds  # not raised on its own: a consequence
    causes = next(line for line in outcome.lines if line.startswith("causes run=exploding"))
    first_cause = causes.split(": ", 1)[1].split()[0]
    assert first_cause.startswith(f"gradient_path/exploding_gradient@{exploding.step}(")
    folded = re.search(r"folded=\S*non_finite@(\d+)", causes)
    assert folded is not None, causes
    assert exploding.step < int(folded.group(1))
    assert exploding.subject in {"0", "2", "4"}


def test_the_headless_demo_says_what_happened_and_its_record_replays(
    gallery: Gallery, capsys: pytest.CaptureFixture[str]
) -> None:
    """``traintop demo healthy --headless --record FILE``: its lines, and a run log that
    ``traintop replay`` shows again."""
    from tui.cli import main

    outcome = gallery.outcome("healthy", fixed=False)
    assert outcome.status == 0, outcome.output
    lines = outcome.lines
    assert lines[0].startswith("listening on unix:") and lines[0].endswith("/monitor.sock")
    assert lines[1].startswith("connected run=healthy ")
    assert any(line.startswith("run=healthy step=0 ") for line in lines)
    assert any(line.startswith("run=healthy step=1499 ") for line in lines)
    assert lines[-1] == "disconnected run=healthy reason=finished"
    recorded = gallery.healthy_log.read_text().splitlines()
    assert recorded[0].startswith('{"v":1,"kind":"hello"')
    assert recorded[-1].startswith('{"v":1,"kind":"bye"')

    assert main(["replay", str(gallery.healthy_log), "--headless", "--summary-every", "50"]) == 0
    replayed = capsys.readouterr().out
    assert replayed.splitlines()[0].startswith("connected run=healthy ")
    assert "run=healthy step=1499 " in replayed
