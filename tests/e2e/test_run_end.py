"""How a run ended travels in its bye: closed, interrupted, or the error that ended it."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from probes.kernel.wire import make_frame
from probes.runtime.lifecycle import end_reason
from tests.collector import FrameCollector, wait_for_bye
from tests.frames import hello, probe_alert, step
from tui.headless import HeadlessMonitor
from tui.server import Connection
from tui.state import MonitorState

CONN = Connection(1, "test", None)

SETUP = """
import torch, probes
from torch import nn
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
LOOP = """
for i in range(10):
    with probe.step():
        loss = model(torch.randn(4, 3)).pow(2).mean()
        optimizer.zero_grad(); loss.backward(); optimizer.step(); probe.log(loss=loss)
    if i == 5:
        raise RuntimeError("boom at 5")
"""
PROGRAMS = {
    # the loop inside ``with probes.watch(...)``: __exit__ sees the error
    "context manager": SETUP
    + "with probes.watch(model, optimizer) as probe:\n"
    + "\n".join("    " + line for line in LOOP.splitlines()),
    # a probe never closed: the exit handler finds the error in sys.last_value
    "exit handler": SETUP + "probe = probes.watch(model, optimizer)\n" + LOOP,
}


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_an_uncaught_error_is_the_bye_reason(collector: FrameCollector, program: str) -> None:
    env = {**os.environ, "TRAINTOP_ADDRESS": str(collector.address)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAMS[program]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "boom at 5" in done.stderr
    wait_for_bye(collector)
    assert collector.kinds("bye")[0]["reason"] == "error: RuntimeError: boom at 5"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (None, "closed"),
        (KeyboardInterrupt(), "interrupted"),
        (SystemExit(0), "closed"),
        (SystemExit(None), "closed"),
        (SystemExit(2), "exit status 2"),
        (ValueError("bad"), "error: ValueError: bad"),
    ],
)
def test_end_reason(error: BaseException | None, reason: str) -> None:
    assert end_reason(error) == reason


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        ("closed", "finished"),
        ("interrupted", "interrupted"),
        ("error: RuntimeError: boom", "error: RuntimeError: boom"),
    ],
)
def test_the_monitor_shows_how_the_run_ended(reason: str, shown: str) -> None:
    state = MonitorState()
    for frame in (hello(), step(0), make_frame("bye", run="run-a", reason=reason)):
        state.apply(1, frame)
    [event] = state.connection_closed(1, "connection closed by the run")
    assert event.reason == shown


def test_a_run_gone_without_a_bye_says_what_happened_to_its_connection() -> None:
    state = MonitorState()
    for frame in (hello(), step(0)):
        state.apply(1, frame)
    [event] = state.connection_closed(1, "connection lost: reset by peer")
    assert event.reason == "connection lost: reset by peer"


def test_the_monitor_keeps_the_newest_ended_runs_only() -> None:
    from tui.state import MAX_ENDED_RUNS

    state = MonitorState()
    for n in range(MAX_ENDED_RUNS + 5):
        state.apply(n, hello(run=f"run-{n}"))
        state.connection_closed(n, "connection closed by the run")
    state.apply(999, hello(run="live"))
    assert len(state.runs) == MAX_ENDED_RUNS + 1
    assert "run-0" not in state.runs and f"run-{MAX_ENDED_RUNS + 4}" in state.runs
    assert state.runs["live"].connected


@pytest.mark.parametrize("measured", [True, False])
def test_fail_on_judges_an_unmeasured_loop_when_the_run_ends(measured: bool) -> None:
    # `steps_not_measured` may end (an LR range test, then the measured loop): --fail-on
    # counts it only if the run ended without a measured step.
    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10**9, fail_on="warning")
    frames = [hello(), probe_alert("steps_not_measured", "warning", 0)]
    frames += [step(i, seq=i + 2) for i in range(3)] if measured else []
    for frame in [*frames, make_frame("bye", run="run-a", reason="closed")]:
        monitor.frame_received(CONN, frame)
        assert monitor.failed_by is None, out.getvalue()  # not while the run goes on
    monitor.connection_closed(CONN, "connection closed by the run")
    assert (monitor.failed_by is not None) is not measured, out.getvalue()
